"""`shoal kill JOB`: stop a job and everything it started; safe to repeat."""

from __future__ import annotations

import argparse

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.launch.control import kill_job


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kill", help="stop a job (idempotent)")
    parser.add_argument("job", help="job id, id prefix or name (newest)")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds to let the launcher stop the tasks before SIGKILL")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = store.find(args.job)
        job = kill_job(store, job, env.executor(job.executor), timeout=args.timeout)
    env.say(f"job {job.id}: {job.state.value}" + (f" ({job.reason})" if job.reason else ""))
    return int(ExitCode.OK)
