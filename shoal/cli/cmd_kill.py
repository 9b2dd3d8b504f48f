"""`shoal kill [JOB]`: stop a job (the newest running one if none is named) and everything it started;
safe to repeat."""

from __future__ import annotations

import argparse

from shoal.cli.arg_types import positive_duration
from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.control import describe_checks, kill_job, sweep_job
from shoal.launch.job_refs import find_running_job


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kill", help="stop a job (idempotent)")
    add_job_argument(parser, newest_by_default=True, running_first=True)
    parser.add_argument("--timeout", type=positive_duration, default=20.0,
                        help="how long to let the launcher stop the tasks before SIGKILL: seconds, or 30s, 5m"
                        " (default: 20)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = find_running_job(store, args.job)
        ended_before = job.state.is_terminal
        executor = env.executor(job.executor)
        job = kill_job(store, job, executor, timeout=args.timeout)
        checks = sweep_job(store, job, executor, kill=True)  # verified: nothing of it is left anywhere
    said = f"{job.state.value}" + (f" ({job.reason})" if job.reason else "")
    env.say(f"job {job.id} had ended already: {said}" if ended_before else f"job {job.id}: {said}")
    for line in describe_checks(checks or [], killed=True):
        env.say(line)
    return int(ExitCode.OK)
