"""Following a job in the terminal until it ends — `shoal attach JOB`, and `shoal train` / `run`
in a terminal, which follow the launcher they started in the background — and what Ctrl-C does
meanwhile (`CtrlC`): detach at once (attach), or ask whether to detach or stop (train / run).

Either way the command ends with the job's exit code once the job is over, or 0 when it
detaches. Must run on the main thread (it handles SIGINT while it follows); blocks while the
job runs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode, recorded_exit_code
from shoal.cli.interrupt import Choice, ask_detach_or_stop
from shoal.launch.detach import signal_launcher
from shoal.launch.kill_request import mark_kill_requested, withdraw_kill_request
from shoal.launch.follow import JobFollower
from shoal.launch.records import JobRecord, JobStore


class CtrlC(Enum):
    """What Ctrl-C does while a job is followed."""

    DETACH = "detach"   # shoal attach: stop following, the job keeps running
    ASK = "ask"         # shoal train / run in a terminal: ask, detach or stop (stop by default)


def follow_job(store: JobStore, job: JobRecord, env: Environment, ctrl_c: CtrlC) -> int:
    """Print `job`'s output until it is over; returns the exit code (the job's, or 0 when the
    user detached)."""
    follower = JobFollower(store, job, env.executor(job.executor), _write_to(env))
    stopping = False
    # train / run: SIGTERM to the command (`timeout`, a closing tmux) stops the job, as it does
    # a launcher in the foreground; attach: it only ends the following
    terminated = threading.Event()
    with _sigint_flag() as interrupted, _sigterm_flag(terminated, interrupted, ctrl_c is CtrlC.ASK):
        while True:
            ended = follower.run(interrupted.is_set)
            if ended is not None:
                return recorded_exit_code(ended)
            interrupted.clear()
            if stopping:  # Ctrl-C again while it stops: the launcher skips the grace period
                signal_launcher(follower.job)
                env.say("shoal | stopping now (no grace period)", err=True)
                continue
            if terminated.is_set():
                choice = Choice.STOP
            else:
                choice = Choice.DETACH if ctrl_c is CtrlC.DETACH else _ask(env)
            if choice is Choice.DETACH:
                env.say(detached_text(follower.job.id), err=True)
                return int(ExitCode.OK)
            stopping = True
            mark_kill_requested(follower.job.job_dir, by="SIGTERM to the shoal command following it"
                                if terminated.is_set() else "Ctrl-C")
            if signal_launcher(follower.job):
                env.say(f"shoal | stopping job {follower.job.id} (the chief saves a checkpoint first;"
                        " Ctrl-C again to skip the grace period)", err=True)
            else:
                withdraw_kill_request(follower.job.job_dir)


def detached_text(job_id: str, intro: str = "") -> str:
    """How to reach a job that runs on in the background."""
    head = intro or f"shoal | detached; job {job_id} keeps running in the background"
    return "\n".join((
        head,
        f"  shoal attach {job_id}   follow its output again (Ctrl-C there only detaches)",
        f"  shoal status {job_id}   its tasks",
        f"  shoal logs {job_id}     its task logs",
        f"  shoal kill {job_id}     stop it (the chief saves a final checkpoint first)",
    ))


def _ask(env: Environment) -> Choice:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C at the prompt: stop
    try:
        return ask_detach_or_stop(env.stdin, env.stderr)
    except KeyboardInterrupt:
        return Choice.STOP
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_to(env: Environment):
    def write(data: bytes) -> None:
        env.stdout.flush()
        env.stdout_bytes.write(data)
        env.stdout_bytes.flush()
    return write


@contextmanager
def _sigint_flag() -> Iterator[threading.Event]:
    """While inside: SIGINT sets the event instead of raising KeyboardInterrupt (on the main
    thread; elsewhere KeyboardInterrupt cannot arrive and nothing is installed)."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _sigterm_flag(terminated: threading.Event, interrupted: threading.Event, install: bool) -> Iterator[None]:
    """While inside (when `install`, on the main thread): SIGTERM sets both events instead of
    ending the process, so the job is stopped and followed to its end."""
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(_signum, _frame) -> None:
        terminated.set()
        interrupted.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
