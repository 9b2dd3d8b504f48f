"""`shoal tensorboard [JOB] [--port 6006]`: TensorBoard on the directories a job's tasks
wrote their summaries to (the newest job if none is named); stopping this command (Ctrl-C,
SIGTERM) stops TensorBoard too."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket

from shoal.cli.environment import Environment
from shoal.cli.errors import MissingTool, UsageError
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
    parser.add_argument("--port", type=_port, default=6006, help="the port to serve on (default: 6006)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = find_job(store, args.job)
    flags, what = logdir_flags(job)
    command = _tensorboard(env, flags)
    _check_free(args.host, args.port)
    env.say(f"TensorBoard on {what}: http://{args.host}:{args.port}/ (Ctrl-C stops)")
    code = run_in_group([*command, *flags, "--host", args.host, "--port", str(args.port)],
                        env.environ)
    if code is None:
        return int(ExitCode.KILLED)
    return int(ExitCode.OK) if code == 0 else int(ExitCode.ERROR)  # TensorBoard said why, above


def _port(text: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; give 1 to 65535, e.g. 6007")
    return int(text)


def _check_free(host: str, port: int) -> None:
    """UsageError naming the port if TensorBoard could not listen on it (in use, or a host not
    of this machine); a moment later another process may still take it. Blocks on one bind."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard's server: TIME_WAIT is free
            probe.bind((host, port))
    except OSError as e:
        raise UsageError(f"cannot serve on {host}:{port} ({e.strerror or e}); pick another port with --port"
                         " (or another --host)") from e


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
