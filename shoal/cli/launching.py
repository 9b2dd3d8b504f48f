"""What `shoal train` and `shoal run` share: allocate and plan a JobSpec on an executor,
print the plan (dry run) or run it in the foreground, and turn the job's end into the exit
code. With `--detach`, or in a terminal, the launcher runs in the background instead
(shoal/cli/background.py): it is this same command, run again with a hidden flag."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import ContextManager

from shoal.cli.background import launch_in_background
from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.executors import add_host_flags, executor_for
from shoal.cli.exit_codes import ExitCode, job_exit_code
from shoal.launch.detach import BACKGROUND_FLAG
from shoal.launch.executor import Executor, LaunchNotes, Queued
from shoal.launch.errors import SpecError, WorkspaceError
from shoal.launch.executor_local import KIND as LOCAL
from shoal.launch.plan import format_plan, is_job_id, job_dir_for, make_plan, new_job_id
from shoal.launch.preflight import check_plan
from shoal.launch.queued_job import QueuedJob
from shoal.launch.runner import run_job
from shoal.launch.setup_signals import (DeferredStop, sigterm_ignored, stop_like_ctrl_c, stops_deferred,
                                        stop_signal_name)
from shoal.launch.spec import JobSpec


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (every task's command and environment) and exit")
    parser.add_argument("--detach", action="store_true",
                        help="run the job in the background: print its id and how to follow it"
                        " (shoal attach JOB), and exit 0")
    parser.add_argument(BACKGROUND_FLAG, dest="background_job_id", default=None,
                        help=argparse.SUPPRESS)  # run as the background launcher of this job id
    parser.add_argument("--show-secret", action="store_true",
                        help="with --dry-run: print the job secret (hidden otherwise), so the"
                        " printed commands, run by hand, make a working job")
    add_host_flags(parser)


def launch(spec: JobSpec, args: argparse.Namespace, env: Environment) -> int:
    """Plan `spec`; print the plan if --dry-run, else check it (shoal/launch/preflight.py)
    and run the job (in the background with --detach, or followed from a terminal). Returns the exit code."""
    if args.show_secret and not args.dry_run:
        raise UsageError("--show-secret only goes with --dry-run (a job's secret is never"
                         " printed while it runs)")
    background_id = getattr(args, "background_job_id", None)
    if background_id is not None and not is_job_id(spec.name, background_id):
        raise SpecError(f"{background_id!r} is not an id for a job named {spec.name!r}; {BACKGROUND_FLAG}"
                        " is for the launcher --detach starts; leave it out", source="flags",
                        field=BACKGROUND_FLAG)
    if not args.dry_run and background_id is None and (args.detach or env.interactive):
        return launch_in_background(spec, args, env, follow=not args.detach)
    executor = executor_for(spec, args, env)
    job_id = background_id or new_job_id(spec.name)
    if args.dry_run:  # nothing runs: SIGTERM ends it as before
        return _launch(spec, args, env, executor, job_id, DeferredStop())
    # SIGTERM and Ctrl-C from here on are remembered: the setup's handlers and then the runner's
    # take them over while they are in place; one before the runner's stops the job as soon as
    # they are; a SIGTERM after the job ended (recording its exit code, closing the executor) lets
    # that finish, a Ctrl-C then cuts it short
    with stops_deferred() as stop:
        return _launch(spec, args, env, executor, job_id, stop)


def _launch(spec: JobSpec, args: argparse.Namespace, env: Environment, executor: Executor, job_id: str,
            stop: DeferredStop) -> int:
    try:
        try:
            with _queue_record(executor, spec, job_id, env, dry_run=args.dry_run):
                plan = make_plan(spec, executor.allocate(spec), job_id=job_id, shoal_home=env.shoal_home,
                                 workdir=env.cwd)
                if not args.dry_run:
                    check_plan(plan, spec, local=executor.kind == LOCAL, no_ps_asked=getattr(args, "ps", None) == 0)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (setup_signals.py): exit 130 saying so
            with sigterm_ignored():
                executor.close()
            env.say(f"shoal {args.command}: stopped by {stop_signal_name(e)} while the job was being set up;"
                    " it was not started, and what the setup had started is stopped", err=True)
            raise
        if args.dry_run:
            notes = executor.launch_notes() if isinstance(executor, LaunchNotes) else ""
            env.say(notes + format_plan(plan, show_secret=args.show_secret), end="")
            return int(ExitCode.OK)
        with env.store() as store:
            result = run_job(plan, executor=executor, store=store, out=env.stdout_bytes,
                             live_status=env.is_tty, stop_pending=lambda: stop.signal)
            stop.stop_deferring_ctrl_c()  # the job ended: Ctrl-C may cut the teardown short again
            code = job_exit_code(result)
            try:
                store.set_exit_code(plan.job_id, code)
            except WorkspaceError as e:  # the job ran and ended: its exit code stands (said above, too)
                env.say(f"shoal {args.command}: the job's exit code was not recorded: {e}", err=True)
        return code
    finally:
        executor.close()


def _queue_record(executor: Executor, spec: JobSpec, job_id: str, env: Environment, *,
                  dry_run: bool) -> ContextManager[object]:
    """Around allocating and planning a job whose executor may wait in a queue (`--slurm`): the
    job's record while it waits (shoal/launch/queued_job.py), told each state of the wait. For
    the other executors, SIGTERM stops the setup as Ctrl-C does (shoal/launch/setup_signals.py);
    nothing for a dry run."""
    if dry_run:
        return nullcontext()
    if not isinstance(executor, Queued):
        return stop_like_ctrl_c()
    queued = QueuedJob(env.store(), job_id, spec.name, job_dir_for(env.shoal_home, job_id), executor.kind)
    return queued if executor.watch_queue(queued.update) else stop_like_ctrl_c()
