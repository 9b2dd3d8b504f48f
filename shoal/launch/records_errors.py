"""`records_failure`: an SQLite error of the job records (jobs.db) as the WorkspaceError a
user can act on — naming the file, what went wrong and the fix: free space for a full disk,
move the file aside for a damaged one, permissions for a read-only one. Pure; never blocks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from shoal.launch.errors import WorkspaceError

_FULL = ("SQLITE_FULL",)
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_READ_ONLY = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")


def records_failure(path: Path, error: sqlite3.Error) -> WorkspaceError:
    """The WorkspaceError that says why the records at `path` could not be used, and the fix."""
    kind = _kind(error)
    if kind in _FULL:
        fix = (f"free space on the disk that holds {path.parent}, or set SHOAL_HOME to a folder on"
               " another disk")
    elif kind in _DAMAGED:
        fix = (f"the file is damaged: move it aside (mv {path} {path}.damaged) and shoal starts new"
               f" records (the jobs' folders under {path.parent / 'jobs'} stay), or recover what it"
               f" holds with sqlite3 {path} .recover")
    elif kind in _READ_ONLY:
        fix = "make it and its folder writable, or set SHOAL_HOME to a writable directory (default ~/.shoal)"
    else:
        fix = (f"check the disk that holds {path.parent} (is it full, or failing?), or set SHOAL_HOME to a"
               " writable directory (default ~/.shoal)")
    return WorkspaceError(f"cannot use the job records {path}: {error}; {fix}")


def _kind(error: sqlite3.Error) -> str:
    """SQLite's name for `error` (SQLITE_FULL, ...; the primary code of an extended one)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    if name:
        return name if name.count("_") == 1 else "_".join(name.split("_")[:2])
    text = str(error)
    if "full" in text:
        return "SQLITE_FULL"
    if "malformed" in text or "not a database" in text:
        return "SQLITE_CORRUPT"
    if "readonly" in text or "unable to open" in text:
        return "SQLITE_READONLY"
    return ""
