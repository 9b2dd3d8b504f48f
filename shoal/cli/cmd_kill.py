"""`shoal kill [JOB]`: stop a job (the newest running one if none is named) and everything it started;
safe to repeat.

The job's line comes first; then one line per host checked. When the kill could not be
verified — the executor cannot say whether the tasks still run (a hung slurmctld), or a host
could not be checked or still holds a process that survived SIGKILL — the command fails with
`KillUnverified` (exit 6, as `shoal check` that could not reach a host), naming what to check
by hand."""

from __future__ import annotations

import argparse

from shoal.cli.arg_types import positive_duration
from shoal.cli.environment import Environment
from shoal.cli.errors import KillUnverified
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.control import describe_checks, kill_job, sweep_job
from shoal.launch.errors import TaskStateUnknown
from shoal.launch.job_refs import find_running_job


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("kill", help="stop a job (idempotent)")
    add_job_argument(parser, newest_by_default=True, running_first=True)
    parser.add_argument("--timeout", type=positive_duration, default=20.0,
                        help="how long to let the launcher stop the tasks before SIGKILL: seconds, or 30s, 5m"
                        " (default: 20)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    unknown = None
    with env.store() as store:
        job = find_running_job(store, args.job)
        ended_before = job.state.is_terminal
        executor = env.executor(job.executor)
        try:
            job = kill_job(store, job, executor, timeout=args.timeout)
            checks = sweep_job(store, job, executor, kill=True) or []  # verified: nothing of it is left anywhere
        except TaskStateUnknown as e:
            job, checks, unknown = store.find(job.id), [], e
    said = f"{job.state.value}" + (f" ({job.reason})" if job.reason else "")
    env.say(f"job {job.id} had ended already: {said}" if ended_before else f"job {job.id}: {said}")
    for line in describe_checks(checks, killed=True):
        env.say(line)
    if unknown is not None:
        raise KillUnverified(f"job {job.id} is stopped, but it could not be checked that nothing of it is left:"
                             f" {unknown}; shoal check --kill {job.id} checks again")
    bad = [c for c in checks if c.error or c.survivors]
    if bad:
        raise KillUnverified(f"job {job.id} is stopped, but {len(bad)} of {len(checks)} hosts could not be checked"
                             f" or still hold a process of it (above); shoal check --kill {job.id} tries again")
    return int(ExitCode.OK)
