"""`shoal check JOB [--kill]`: is any process of the job left on any of its hosts?"""

from __future__ import annotations

import argparse

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.control import describe_checks, launcher_alive, sweep_job
from shoal.launch.errors import LaunchError
from shoal.launch.job_refs import find_job


class LeftoversFound(LaunchError):
    """A check found processes of a job that should have none (or could not reach a host)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("check", help="look for processes a job left on its hosts",
                            description="Look on every host a job ran on for its processes (by the"
                            " SHOAL_JOB_ID in their environment, so also those that left their process"
                            " group); exit 0 if none is left.")
    add_job_argument(parser, newest_by_default=True)
    parser.add_argument("--kill", action="store_true", help="SIGKILL what is found")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job = find_job(store, args.job)
        running = not job.state.is_terminal and launcher_alive(job)
        if not job.state.is_terminal and not args.kill:
            if running:
                env.say(f"job {job.id} is {job.state.value}: its tasks are meant to run; checking anyway")
            else:
                env.say(f"job {job.id}'s launcher (pid {job.launcher_pid}) is gone, so nothing of the job should"
                        " run; checking (shoal status records the job KILLED and stops what is left)")
        checks = sweep_job(store, job, env.executor(job.executor), kill=args.kill)
    if checks is None:
        raise LaunchError(f"the {job.executor!r} executor cannot look for a job's processes")
    for line in describe_checks(checks, killed=args.kill):
        env.say(line)
    bad = [c for c in checks if c.error or c.survivors or (c.found and not args.kill)]
    if bad:
        fix = ("" if args.kill else f"; it is running: shoal kill {job.id} stops it" if running
               else "; shoal check --kill stops what is left")
        raise LeftoversFound(f"job {job.id}: {len(bad)} of {len(checks)} hosts are not clean{fix}")
    if any(c.found for c in checks):
        env.say(f"job {job.id}: killed what was left; nothing runs now")
    return int(ExitCode.OK)
