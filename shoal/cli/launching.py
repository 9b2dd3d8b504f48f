"""What `shoal train` and `shoal run` share: plan a JobSpec, print it (dry run) or run
it in the foreground, and turn the job's result into the exit code."""

from __future__ import annotations

import argparse

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.launch.monitor import gpu_count
from shoal.launch.plan import format_plan, make_plan, new_job_id
from shoal.launch.runner import run_job
from shoal.launch.spec import JobSpec
from shoal.launch.states import JobState


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (every task's command and environment) and exit")


def launch(spec: JobSpec, args: argparse.Namespace, env: Environment) -> int:
    """Plan `spec`; print the plan if --dry-run, else run the job. Returns the exit code."""
    gpus = gpu_count() if any(r.gpus for r in spec.roles.values()) else 0
    plan = make_plan(spec, job_id=new_job_id(spec.name), shoal_home=env.shoal_home,
                     workdir=env.cwd, python=env.python, gpu_count=gpus)
    if args.dry_run:
        env.say(format_plan(plan), end="")
        return int(ExitCode.OK)
    with env.store() as store:
        result = run_job(plan, store=store, out=env.stdout_bytes, base_env=env.environ,
                         live_status=env.is_tty)
    if result.state is JobState.SUCCEEDED:
        return int(ExitCode.OK)
    return result.exit_code or int(ExitCode.JOB_FAILED)
