"""Processes of this machine, through psutil: a process's create time, whether a recorded
(pid, create time) still names the same live process, the live members of a process group,
and signalling and stopping a group. Thread-safe; only `stop_group` waits (bounded)."""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

import psutil

_SAME_START = 0.05
"""Create times within this many seconds are the same process (psutil rounds them)."""


def process_started(pid: int) -> Optional[float]:
    """The create time of process `pid` (psutil's), None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: Optional[int], started: Optional[float]) -> Optional[psutil.Process]:
    """The live process `pid` if it was created at `started`; None if it is gone, a zombie,
    or a later process that reuses the pid. Without a create time we cannot tell, so None."""
    if not pid or not started:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) > _SAME_START:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def group_members(pgid: int, exclude: int = 0) -> list[int]:
    """The live (non-zombie) processes of process group `pgid`, but `exclude`."""
    out = []
    for pid in psutil.pids():
        if pid == exclude:
            continue
        try:
            if os.getpgid(pid) != pgid:
                continue
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except (OSError, psutil.Error):
            continue  # gone meanwhile
    return out


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`; a group already gone (or not ours) is ignored."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pgid: int, grace: float, exclude: int = 0) -> None:
    """TERM the live members of group `pgid` (but `exclude`), KILL what is left after `grace`
    seconds. Blocks up to `grace`; does nothing if none is left."""
    if not group_members(pgid, exclude):
        return
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pgid, exclude):
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)
