"""`LogMux`: copies every task's output to the console, each whole line prefixed with
the task ("mnist.worker.1 | ..."), and to the task's own log file; spots progress lines.

Pipes are read in binary and split on b"\\n" only, so a line written in pieces is still
printed whole, and no line is lost: a last line without "\\n" is completed at EOF. One
reader thread per task attempt; console writes are serialized by a lock, so `attach`,
`note` and `set_status` are thread-safe.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import IO, Callable, Optional

PROGRESS_RE = re.compile(rb"\bstep=(\d+)\b.*?\bloss=([-+0-9.eE]+|nan|inf)")
"""A progress line from a worker: `step=<global step> loss=<float> ...`."""

ProgressCallback = Callable[[str, int, float], None]
_CHUNK = 1 << 16
_CLEAR = b"\r\x1b[K"


class LogMux:
    """The job's console and log files. `out` is a binary stream (sys.stdout.buffer);
    `live_status` draws a status line at the bottom (for terminals only)."""

    def __init__(self, out: IO[bytes], *, on_progress: Optional[ProgressCallback] = None,
                 live_status: bool = False) -> None:
        self._out = out
        self._on_progress = on_progress
        self._live = live_status
        self._status = b""
        self._lock = threading.Lock()

    def attach(self, label: str, name: str, pipe: IO[bytes], log_path: str) -> threading.Thread:
        """Start copying `pipe` until EOF; returns the (daemon) reader thread. The log
        file is opened for append, so a restarted task's log follows on."""
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        thread = threading.Thread(
            target=self._pump, args=(label.encode() + b" | ", name, pipe, log),
            name=f"logmux-{name}", daemon=True,
        )
        thread.start()
        return thread

    def note(self, text: str) -> None:
        """Print one launcher line (state changes, summaries) to the console."""
        self._emit([text.encode() + b"\n"])

    def set_status(self, text: str) -> None:
        """Replace the live status line (no-op unless live_status)."""
        if not self._live:
            return
        with self._lock:
            self._status = text.encode()[:200]
            self._write(_CLEAR + self._status)

    def clear_status(self) -> None:
        """Remove the live status line, e.g. before the final summary."""
        with self._lock:
            if self._live and self._status:
                self._status = b""
                self._write(_CLEAR)

    def _pump(self, prefix: bytes, name: str, pipe: IO[bytes], log: IO[bytes]) -> None:
        fd = pipe.fileno()
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                cut = pending.rfind(b"\n")
                if cut < 0:
                    continue
                complete, pending = pending[: cut + 1], pending[cut + 1:]
                self._lines(prefix, name, complete, log)
            if pending:
                self._lines(prefix, name, pending + b"\n", log)
        finally:
            log.close()
            pipe.close()

    def _lines(self, prefix: bytes, name: str, block: bytes, log: IO[bytes]) -> None:
        log.write(block)
        log.flush()
        lines = [line + b"\n" for line in block[:-1].split(b"\n")]  # block ends with \n
        self._emit([prefix + line for line in lines])
        if self._on_progress is not None and b"step=" in block:
            for line in reversed(lines):
                match = PROGRESS_RE.search(line)
                if match:
                    self._on_progress(name, int(match.group(1)), float(match.group(2)))
                    break

    def _emit(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        with self._lock:
            if self._live and self._status:
                data = _CLEAR + data + self._status
            self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            self._out.write(data)
            self._out.flush()
        except (BrokenPipeError, ValueError):
            pass  # the console went away; the log files still get everything
