"""`attach_output`: show one task attempt's output through the LogMux (whole prefixed lines
on the console, the bytes as they come in the task's log file, progress spotted).

A TaskHandle yields its output as chunks of bytes; the LogMux reads a pipe. Until the mux
takes an iterator itself, a feeder thread writes the chunks, unchanged, into a pipe the
mux reads. The log file is created 0600 (its folder 0700) before the mux opens it for
append, so it stays private.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from shoal.launch.errors import WorkspaceError
from shoal.launch.files import private_dirs, private_file
from shoal.launch.logmux import LogMux


def attach_output(mux: LogMux, label: str, name: str, chunks: Iterator[bytes],
                  log_path: str, attempt: int = 1) -> threading.Thread:
    """Start copying `chunks` to `mux` under `label`; returns the thread to join, which
    ends once the last line is shown and logged. An `attempt` after the first (a restart)
    begins with a line of the launcher's in the log file, so a reader can tell the attempts
    apart (the console has the state changes). Thread-safe; blocks only to create the log
    file (and its folder) and write that line. A log that cannot be created or written (a
    full disk) is only noted (task_log.py): the task's lines still show on the console."""
    fix = "set SHOAL_HOME to a writable directory (default ~/.shoal)"
    try:
        private_dirs(Path(log_path).parent, "the job's log folder", fix)
        private_file(Path(log_path), "the task's log file", fix)
    except WorkspaceError:
        pass  # the log's own open fails the same way, and says so once
    header = b""
    if attempt > 1:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        header = f"shoal | {stamp} {label}: attempt {attempt} starts (restarted)\n".encode()
    read_fd, write_fd = os.pipe()
    reader = mux.attach(label, name, os.fdopen(read_fd, "rb", buffering=0), log_path, header=header)
    threading.Thread(target=_feed, args=(chunks, write_fd), name=f"feed-{name}",
                     daemon=True).start()
    return reader


def _feed(chunks: Iterator[bytes], write_fd: int) -> None:
    broken = False
    try:
        for chunk in chunks:  # drained to the end even if the mux went away: never block the task
            if not broken:
                try:
                    _write_all(write_fd, chunk)
                except OSError:
                    broken = True
    finally:
        os.close(write_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
