"""`shoal train` / `run` with their launcher in the background: `--detach` starts it and names
the job; in a terminal (`Environment.interactive`) the command starts it and follows it, so that
Ctrl-C can offer to detach (shoal/cli/following.py). The launcher is the same `shoal train/run`
command line, run again under a job id chosen here (shoal/launch/detach.py).
"""

from __future__ import annotations

import argparse
import shutil
import time

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode, recorded_exit_code
from shoal.cli.following import CtrlC, detached_text, follow_job
from shoal.launch.detach import BackgroundLauncher, Started, background_argv
from shoal.launch.launcher_output import launcher_log_path
from shoal.launch.plan import job_dir_for, new_job_id
from shoal.launch.records import JobRecord, JobStore
from shoal.launch.spec import JobSpec
from shoal.launch.states import TaskState

START_WAIT_S = 30.0
"""How long `--detach` waits for the job to be recorded before it returns anyway."""

SETTLE_S = 10.0
"""How long at most `--detach` then waits for every task to be started (or the job to end), so
a job whose command cannot start is not reported as running (it takes well under a second but
on a machine that is very busy)."""


def launch_in_background(spec: JobSpec, args: argparse.Namespace, env: Environment, *,
                         follow: bool) -> int:
    """Start the job's launcher in the background; then name the job and return 0, or (with
    `follow`) follow it until it ends. Returns the exit code. Blocks."""
    job_id = new_job_id(spec.name)
    log_path = launcher_log_path(job_dir_for(env.shoal_home, job_id))
    launcher = BackgroundLauncher(background_argv(args.argv, args.command, job_id), python=env.python,
                                  environ=env.environ, cwd=env.cwd, log_path=log_path)
    launcher.start()
    with env.store() as store:
        try:
            started = launcher.wait_started(store, job_id, START_WAIT_S)
            while follow and started is Started.STARTING:
                started = launcher.wait_started(store, job_id, START_WAIT_S)
        except KeyboardInterrupt:  # Ctrl-C before the job even started: stop it all
            launcher.terminate()
            env.say("", err=True)
            return int(ExitCode.KILLED)
        if started is Started.EXITED:
            text = launcher.output().rstrip("\n")
            if text:
                env.say(text, err=True)
            if not store.has(job_id):  # failed before the job existed: leave no folder behind
                shutil.rmtree(job_dir_for(env.shoal_home, job_id), ignore_errors=True)
            return launcher.exit_code or int(ExitCode.ERROR)
        job = _settled(store, job_id) if started is Started.RECORDED and not follow else None
        if job is not None and job.state.is_terminal:  # it ended already (a command that cannot run)
            env.say(f"job {job.handle} ended already: {job.state.value}" + (f" ({job.reason})" if job.reason else "")
                    + f"; shoal status {job.number}, shoal logs {job.number}", err=True)
            return recorded_exit_code(job)
        if not follow:
            state = ("is starting" if started is not Started.RECORDED else
                     "waits in the queue" if job is not None and not job.tasks else "runs")
            number = store.find(job_id).number if store.has(job_id) else None
            numbered = f"number {number}, " if number is not None else ""
            env.say(detached_text(job_id, f"job {job_id} {state} in the background ({numbered}launcher pid"
                                          f" {launcher.pid}; its output goes to {log_path})"))
            return int(ExitCode.OK)
        return follow_job(store, store.find(job_id), env, CtrlC.ASK)


def _settled(store: JobStore, job_id: str) -> JobRecord:
    """The recorded job once every task of it runs or it ended, or as it is after SETTLE_S.
    (A task that ended already, one that could not start say, is not settled: the job's end is
    recorded a moment after it, and the launcher's exit code a moment after that.) Blocks (bounded)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        job = store.find(job_id)
        if job.state.is_terminal:
            if job.exit_code is not None:
                return job
        elif not job.tasks:  # waiting in a queue (--slurm): nothing to start yet
            return job
        elif all(t.state is TaskState.RUNNING for t in job.tasks):
            return job
        if time.monotonic() >= deadline:
            return job
        time.sleep(0.05)
