"""`read_new`: the bytes appended to a log file since an offset, read in bounded steps, and
whether the file was truncated meanwhile (`: > worker.0.log`, logrotate's copytruncate).

A file now shorter than the offset was truncated: it is read again from its start, as
`tail -F` does, and the caller says so ("(PATH was truncated; following it from its start)").
A truncated file that grew back past the offset between two reads cannot be told apart from
one that only grew (tail -F has the same blind spot).

Blocks on file system calls (one open, one bounded read); thread-safe (no shared state).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["NewBytes", "read_new", "truncated_note"]


@dataclass(frozen=True)
class NewBytes:
    """At most `limit` bytes of a file from `offset`; `truncated`: the file was shorter than
    the offset asked for, so `offset` is 0 and `data` its start."""

    data: bytes
    offset: int
    truncated: bool = False


def read_new(path: str | os.PathLike, offset: int, limit: int) -> NewBytes:
    """The bytes of `path` from `offset` (from 0 if the file is now shorter), at most `limit`.
    Raises OSError (FileNotFoundError before the file exists) for the caller to judge."""
    with open(path, "rb") as f:
        truncated = os.fstat(f.fileno()).st_size < offset
        if truncated:
            offset = 0
        f.seek(offset)
        return NewBytes(f.read(limit), offset, truncated)


def truncated_note(path: str | os.PathLike) -> str:
    """The line that says `path` was truncated and is read again from its start."""
    return f"({path} was truncated; following it from its start)"
