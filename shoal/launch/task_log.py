"""`TaskLog`: one task attempt's log file, the bytes of its output appended as they come.

The file is a copy; the console and the progress parsing (LogMux) must go on whatever
happens to it. So a failure to open or write it (a full disk, a quota, a lost mount) is not
raised: the file is given up, the failure is said once through `warn` ("shoal | job.worker.0:
cannot write its log PATH: No space left on device; its lines still show here, and are no
longer kept in the file ..."), and later writes are dropped. A restarted task gets a new
TaskLog, which tries the file again.

Blocks on file system calls. Not thread-safe: one per reader thread (LogMux's pump).
"""

from __future__ import annotations

import errno
import os
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

from shoal.launch.files import FILE_MODE

__all__ = ["TaskLog", "TaskLogState"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class TaskLogState(Enum):
    """NEW -> OPEN -> CLOSED; NEW or OPEN -> BROKEN (opening or a write failed, said once)
    -> CLOSED. `close` from any state ends in CLOSED."""

    NEW = "new"
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


class TaskLog:
    """The log file at `path` of the task shown as `label`; `warn` gets one line, once, if the
    file cannot be opened or written. The constructor does no I/O."""

    def __init__(self, path: str | os.PathLike, label: str, warn: Callable[[str], None]) -> None:
        self.path = Path(path)
        self._label = label
        self._warn = warn
        self._fd: Optional[int] = None
        self._mid_line = False  # what was written so far ends inside a line
        self.state = TaskLogState.NEW

    def open(self) -> None:
        """Open the file for appending (created 0600 if missing; its folder is the caller's,
        made private: output.attach_output), so a restarted task's log follows on. Blocks;
        never raises OSError (see the module)."""
        if self.state is not TaskLogState.NEW:
            return
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        except OSError as e:
            self._broken(e)
            return
        self.state = TaskLogState.OPEN

    def write(self, data: bytes) -> None:
        """Append `data` (all of it, or give the file up). Blocks; never raises OSError;
        a no-op unless OPEN."""
        if self.state is not TaskLogState.OPEN or not data:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            self._broken(e)
            return
        self._mid_line = not data.endswith(b"\n")

    def close(self) -> None:
        """Complete a last line left without "\\n", then close the file. Idempotent; safe in
        `finally`; never raises OSError."""
        if self.state is TaskLogState.OPEN and self._mid_line:
            self.write(b"\n")
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass  # what could not be written was already said by write
        self.state = TaskLogState.CLOSED

    def _broken(self, error: OSError) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass
        self.state = TaskLogState.BROKEN
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(self.path) else ""
        fix = "free space on that disk" if error.errno in _NO_SPACE else "make it writable"
        self._warn(f"shoal | {self._label}: cannot write its log {self.path}: "
                   f"{error.strerror or error}{where}; its lines still show here, and are no longer"
                   f" kept in the file ({fix} for later logs)")
