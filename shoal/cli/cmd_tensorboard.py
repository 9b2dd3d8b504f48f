"""`shoal tensorboard [JOB] [--port 6006]`: TensorBoard on the directories a job's tasks
wrote their summaries to (the newest job if none is named); stopping this command (Ctrl-C,
SIGTERM) stops TensorBoard too."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil

from shoal.cli.environment import Environment
from shoal.cli.errors import MissingTool
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.job_refs import find_job
from shoal.launch.tensorboard import logdir_flags, run_in_group


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tensorboard", help="start TensorBoard on a job's summaries",
                            description="Start TensorBoard on the directories the job's tasks"
                            " reported writing summaries to (else its model dir); it stops when"
                            " this command is stopped.")
    add_job_argument(parser, newest_by_default=True)
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--host", default="127.0.0.1")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = find_job(store, args.job)
    flags, what = logdir_flags(job)
    command = _tensorboard(env, flags)
    env.say(f"TensorBoard on {what}: http://{args.host}:{args.port}/ (Ctrl-C stops)")
    code = run_in_group([*command, *flags, "--host", args.host, "--port", str(args.port)],
                        env.environ)
    return int(ExitCode.KILLED) if code is None else code


def _tensorboard(env: Environment, flags: list[str]) -> list[str]:
    """The command that starts TensorBoard: `tensorboard` on PATH, else the module in this
    Python; MissingTool if neither is there."""
    found = shutil.which("tensorboard", path=env.environ.get("PATH", os.defpath))
    if found:
        return [found]
    if importlib.util.find_spec("tensorboard") is not None:
        return [env.python, "-m", "tensorboard.main"]
    raise MissingTool(
        f"TensorBoard is not installed in {env.python}; pip install tensorboard, then"
        f" run this again (or: tensorboard {' '.join(flags)})"
    )
