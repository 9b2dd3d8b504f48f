"""Process and wait helpers for the multi-host fixtures: every wait bounded, every stop by PID.

Nothing here keeps state; the functions block for at most the timeout they are given and are
safe to call from any thread.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil


class FixtureError(RuntimeError):
    """A step of the multi-host fixtures failed (a command, a bounded wait).

    The message names the step and shows its output or log.
    """


def run(argv: list[str], *, timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run argv to completion (blocks for at most `timeout` s); text output captured.

    Raises FixtureError naming the command and its output when `check` and it exits non-zero.
    """
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        raise FixtureError(f"{' '.join(argv)!r} did not finish within {timeout} s") from e
    if check and done.returncode != 0:
        raise FixtureError(f"{' '.join(argv)!r} exited {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str,
               detail: Callable[[], str] = lambda: "", interval: float = 0.1) -> None:
    """Poll `predicate` until it is true; raises FixtureError naming `what` (and `detail()`) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            extra = detail()
            raise FixtureError(f"{what}: not reached within {timeout} s" + (f"\n{extra}" if extra else ""))
        time.sleep(interval)


def start_daemon(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start argv in its own session (so pgid == pid), stdout and stderr to `log`. Does not block."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """TERM the process group of `proc`, KILL it after `grace` s, reap it. Idempotent; blocks <= grace + 5 s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    # The group may outlive its leader (children of a daemon): KILL what is left of it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def identity(pid: int) -> tuple[int, float] | None:
    """(pid, create_time) of a living process, or None: a PID plus its start time names one process.

    A zombie counts as dead: it runs nothing, and its parent (often init) reaps it when it likes.
    """
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid, p.create_time()
    except psutil.Error:
        return None


def kill_pids(pids: Iterable[tuple[int, float]], grace: float = 3.0) -> None:
    """TERM, then after `grace` s KILL, each (pid, create_time) that still names the same process.

    A PID whose start time differs belongs to someone else now and is left alone. Blocks <= grace + 3 s.
    """
    procs = []
    for pid, created in pids:
        if (now := identity(pid)) is not None and abs(now[1] - created) < 0.01:
            procs.append(psutil.Process(pid))
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    alive = _wait_gone(procs, grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_gone(alive, 3.0)


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process is gone or a zombie, at most `timeout` s; returns those still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if identity(p.pid) is not None]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def tcp_open(address: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to address:port from this (the root) namespace succeeds now."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False
