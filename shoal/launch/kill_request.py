"""The mark `shoal kill` leaves in a job's folder just before it sends SIGTERM to the job's
launcher, so the launcher can say who stopped the job (`KILLED (stopped by shoal kill)`)
rather than only which signal came. A SIGTERM with no mark is someone else's.

Both calls do one small file operation and never raise; thread-safe."""

from __future__ import annotations

import os
from pathlib import Path

KILL_MARK = "kill-requested"


def mark_kill_requested(job_dir: str | os.PathLike) -> None:
    """Leave the mark (a job folder that cannot be written gets none: the reason then names
    the signal only)."""
    try:
        (Path(job_dir) / KILL_MARK).write_text(f"{os.getpid()}\n")
    except OSError:
        pass


def kill_was_requested(job_dir: str | os.PathLike) -> bool:
    """Whether `shoal kill` left the mark in `job_dir`."""
    return (Path(job_dir) / KILL_MARK).exists()
