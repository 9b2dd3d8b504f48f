"""Processes of this machine, through psutil: a process's create time, whether a recorded
(pid, create time) still names the same live process, and the live members of a process
group. Thread-safe; each call reads the process table once (no waiting)."""

from __future__ import annotations

import os
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
