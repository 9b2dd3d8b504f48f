"""`attach_lines`: print one task attempt's output lines through the LogMux (prefixed on the
console, appended to the task's log file, progress spotted).

The LogMux reads a pipe; a TaskHandle yields lines. Until the mux takes lines itself, a
feeder thread writes the lines into a pipe the mux reads. The log file is created 0600
before the mux opens it for append, so it stays private.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from shoal.launch.files import private_dirs, private_file
from shoal.launch.logmux import LogMux


def attach_lines(mux: LogMux, label: str, name: str, lines: Iterator[bytes],
                 log_path: str) -> threading.Thread:
    """Start copying `lines` to `mux` under `label`; returns the thread to join, which ends
    once the last line is printed and logged. Thread-safe; blocks only to create the log
    file (and its folder, 0700)."""
    fix = "set SHOAL_HOME to a writable directory (default ~/.shoal)"
    private_dirs(Path(log_path).parent, "the job's log folder", fix)
    private_file(Path(log_path), "the task's log file", fix)
    read_fd, write_fd = os.pipe()
    reader = mux.attach(label, name, os.fdopen(read_fd, "rb", buffering=0), log_path)
    threading.Thread(target=_feed, args=(lines, write_fd), name=f"feed-{name}",
                     daemon=True).start()
    return reader


def _feed(lines: Iterator[bytes], write_fd: int) -> None:
    broken = False
    try:
        for line in lines:  # drained to the end even if the mux went away: never block the task
            if not broken:
                try:
                    _write_all(write_fd, line)
                except OSError:
                    broken = True
    finally:
        os.close(write_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
