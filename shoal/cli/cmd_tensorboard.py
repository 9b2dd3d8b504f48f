"""`shoal tensorboard JOB [--port 6006]`: TensorBoard on the job's model dir."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess

from shoal.cli.environment import Environment
from shoal.cli.errors import MissingTool


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tensorboard", help="start TensorBoard on a job's model dir")
    parser.add_argument("job", help="job id, id prefix or name (newest)")
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--host", default="127.0.0.1")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = store.find(args.job)
    if importlib.util.find_spec("tensorboard") is None:
        raise MissingTool(
            f"TensorBoard is not installed in {env.python}; pip install tensorboard, then"
            f" run this again (or: tensorboard --logdir {job.model_dir})"
        )
    env.say(f"TensorBoard on {job.model_dir}: http://{args.host}:{args.port}/ (Ctrl-C stops)")
    return subprocess.call([env.python, "-m", "tensorboard.main", "--logdir", job.model_dir,
                            "--host", args.host, "--port", str(args.port)])
