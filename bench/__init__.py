"""Benchmarks: Shoal measured against a reference run in the same process tree. Not run by CI.

Every figure is a ratio (or sits next to its reference) measured in one run, interleaving the
two sides, because the machines we run on are small and shared. See bench/README.md.

This module holds the process mechanics the benchmarks share: start a helper process in its
own process group that dies with us, and kill that group. Nothing here is thread-safe.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from shoal.launch.plan import free_ports  # noqa: F401 (the benchmarks import it from here)

REPO = Path(__file__).resolve().parents[1]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL if the benchmark dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the finally blocks of the benchmark still kill the group


def spawn(argv: list[str], env: dict[str, str] | None = None, python: str = sys.executable,
          **popen) -> subprocess.Popen:
    """Start `python argv...` from the repository root in a new process group that dies with
    us; `python` may be another interpreter (the peers' virtualenv). Does not block."""
    return subprocess.Popen([python, *argv], cwd=REPO, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent, **popen)


def kill_group(proc: subprocess.Popen | None, grace_s: float = 0.0) -> None:
    """Kill the process group of `proc` (SIGTERM first when `grace_s` > 0, then SIGKILL) and
    reap it. Idempotent; safe in `finally`. Blocks up to `grace_s` + 5 s."""
    if proc is None:
        return
    if grace_s > 0 and proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)  # the group may outlive its leader
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def median(values) -> float:
    return statistics.median(values)


def machine() -> dict:
    """What the figures were measured on (they mean little without it)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}
