"""`shoal attach [JOB]`: follow a running job's output until it ends, and exit with its code."""

from __future__ import annotations

import argparse

from shoal.cli.environment import Environment
from shoal.cli.following import CtrlC, follow_job
from shoal.cli.job_args import add_job_argument
from shoal.launch.job_refs import find_running_job


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "attach", help="follow a job's output until it ends (Ctrl-C only detaches)",
        description="Print a job's output — what its launcher prints (state changes, every"
        " task's lines prefixed with the task, the final summary), else its task logs — from"
        " the start, then follow it until the job ends, and exit with the job's exit code."
        " Ctrl-C stops following; the job keeps running.")
    add_job_argument(parser, newest_by_default=True, running_first=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = find_running_job(store, args.job)
        return follow_job(store, job, env, CtrlC.DETACH)
