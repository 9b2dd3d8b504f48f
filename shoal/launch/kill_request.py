"""The mark `shoal kill` (or Ctrl-C in the terminal following a background launcher) leaves in
a job's folder just before it sends SIGTERM to the job's launcher, so the launcher can say who
stopped the job (`KILLED (stopped by shoal kill)`, `KILLED (stopped by Ctrl-C)`) rather than
only which signal came. A SIGTERM with no fresh mark is someone else's: a mark counts for
`FRESH_S` seconds, and the sender takes it back if its signal could not be sent. The mark is
0600, as the job's other files.

Every call does one small file operation and never raises; thread-safe, and
`kill_requested_by` is fit for a signal handler.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

KILL_MARK = "kill-requested"
FRESH_S = 60.0
"""How long after `shoal kill` wrote it a mark explains a SIGTERM."""


def mark_kill_requested(job_dir: str | os.PathLike, by: str = "shoal kill") -> None:
    """Leave the mark, saying who asks (`by`: "shoal kill", "Ctrl-C"); a job folder that
    cannot be written gets none: the reason then names the signal only."""
    try:
        fd = os.open(Path(job_dir) / KILL_MARK, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as mark:
            mark.write(by[:200])
    except OSError:
        pass


def withdraw_kill_request(job_dir: str | os.PathLike) -> None:
    """Take the mark back (the signal it announced was not sent)."""
    try:
        (Path(job_dir) / KILL_MARK).unlink(missing_ok=True)
    except OSError:
        pass


def kill_requested_by(job_dir: str | os.PathLike) -> str | None:
    """Who asked for the SIGTERM, if a mark in `job_dir` is within the last FRESH_S seconds
    ("shoal kill"), else None."""
    path = Path(job_dir) / KILL_MARK
    try:
        if time.time() - path.stat().st_mtime >= FRESH_S:
            return None
        return path.read_text(errors="replace").strip() or "shoal kill"
    except OSError:
        return None
