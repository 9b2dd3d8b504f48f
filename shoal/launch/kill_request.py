"""The mark `shoal kill` leaves in a job's folder just before it sends SIGTERM to the job's
launcher, so the launcher can say who stopped the job (`KILLED (stopped by shoal kill)`)
rather than only which signal came. A SIGTERM with no fresh mark is someone else's: a mark
counts for `FRESH_S` seconds, and `shoal kill` takes it back if its signal could not be sent.

Every call does one small file operation and never raises; thread-safe, and
`kill_was_requested` is fit for a signal handler.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

KILL_MARK = "kill-requested"
FRESH_S = 60.0
"""How long after `shoal kill` wrote it a mark explains a SIGTERM."""


def mark_kill_requested(job_dir: str | os.PathLike) -> None:
    """Leave the mark (a job folder that cannot be written gets none: the reason then names
    the signal only)."""
    try:
        (Path(job_dir) / KILL_MARK).write_text(f"{os.getpid()}\n")
    except OSError:
        pass


def withdraw_kill_request(job_dir: str | os.PathLike) -> None:
    """Take the mark back (the signal it announced was not sent)."""
    try:
        (Path(job_dir) / KILL_MARK).unlink(missing_ok=True)
    except OSError:
        pass


def kill_was_requested(job_dir: str | os.PathLike) -> bool:
    """Whether `shoal kill` left a mark in `job_dir` within the last FRESH_S seconds."""
    try:
        return time.time() - (Path(job_dir) / KILL_MARK).stat().st_mtime < FRESH_S
    except OSError:
        return False
