"""`LogMux`: copies every task's output to the console, each whole line prefixed with
the task ("mnist.worker.1 | ..."), and to the task's own log file; spots progress lines,
the lines where a worker says which tasks it waits for, a ps's membership lines
(membership_line.py), and the line where a task says which directory it writes TensorBoard summaries to.

Pipes are read in binary. The log file (a `TaskLog`) gets the bytes exactly as they come, as
they come (a last line without "\\n" is completed at EOF); a log file that cannot be written
(a full disk) is given up with one note on the console, while the console and the callbacks
go on. The console gets whole prefixed lines, cut by `LineCutter`: at "\\n", so a line
written in pieces is printed whole; at the last "\\r" of a line still waiting for its "\\n",
so a progress bar's updates show as they happen; and every `MAX_LINE` bytes, so a line
without end costs bounded memory and constant time per byte. One reader thread per task
attempt; console writes are serialized by a lock, so `attach`, `note` and `set_status` are
thread-safe.
"""

from __future__ import annotations

import os
import re
import threading
from typing import IO, Callable, Optional

from shoal.launch.membership_line import MembershipLine, parse_membership
from shoal.launch.progress_line import PROGRESS_RE, ProgressLine, parse_progress, parse_waiting
from shoal.launch.task_log import TaskLog

__all__ = ["PROGRESS_RE", "LineCutter", "LogMux", "MAX_LINE", "SUMMARIES_RE"]

SUMMARIES_RE = re.compile(rb"summaries=(/[^\r\n]*)")
"""A whole line a task prints when it opens its TensorBoard summaries: `summaries=<absolute
directory>` (shoal/train/summaries.py writes it)."""

ProgressCallback = Callable[[str, ProgressLine], None]
"""(task name, its newest progress line in a chunk read)."""
WaitingCallback = Callable[[str, tuple[str, ...]], None]
"""(task name, the tasks its line says it waits for; progress_line.parse_waiting)."""
SummariesCallback = Callable[[str, str], None]
MembershipCallback = Callable[[str, MembershipLine], None]
"""(task name, a membership line it printed)."""
_CHUNK = 1 << 16
_CLEAR = b"\r\x1b[K"

MAX_LINE = 1 << 16
"""Bytes of a task's output shown on one console line; a longer line is shown in pieces."""


class LineCutter:
    """Cuts a byte stream into display lines of at most `limit` bytes, each ending in "\\n".

    `feed` returns the lines that are complete so far; what remains is at most `limit`
    bytes and holds no "\\n" or "\\r". Cost is constant per byte fed. Not thread-safe:
    one per stream.
    """

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._limit = limit
        self._tail = bytearray()
        self._shown_cr = False  # the last line shown was a partial one ending in "\r"

    def feed(self, data: bytes) -> list[bytes]:
        """The display lines completed by `data` (possibly none)."""
        if self._shown_cr:
            self._shown_cr = False
            if data[:1] == b"\n":
                data = data[1:]  # completes the "\r" line already shown
        out: list[bytes] = []
        end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if end < 0:
            self._tail += data
        else:
            block = bytes(self._tail) + data[: end + 1]
            self._tail[:] = data[end + 1:]
            *lines, rest = block.split(b"\n")
            for line in lines:
                out.extend(self._pieces(line))
            if rest.strip(b"\r"):  # a progress update: show it now, its "\n" may never come
                out.extend(self._pieces(rest))
                self._shown_cr = True
        while len(self._tail) > self._limit:
            cut = _utf8_cut(self._tail, self._limit)
            out.append(bytes(self._tail[:cut]) + b"\n")
            del self._tail[:cut]
        return out

    def close(self) -> list[bytes]:
        """The last line, if the stream ended without "\\n"."""
        rest, self._tail = bytes(self._tail), bytearray()
        return [rest + b"\n"] if rest else []

    def _pieces(self, line: bytes) -> list[bytes]:
        out = []
        while len(line) > self._limit:
            cut = _utf8_cut(line, self._limit)
            out.append(line[:cut] + b"\n")
            line = line[cut:]
        out.append(line + b"\n")
        return out


def _utf8_cut(data: bytes | bytearray, at: int) -> int:
    """`at`, moved back (at most 3 bytes) so as not to split a UTF-8 character."""
    for cut in range(at, max(at - 3, 1) - 1, -1):
        if data[cut] & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            return cut
    return at


class LogMux:
    """The job's console and log files. `out` is a binary stream (sys.stdout.buffer);
    `live_status` draws a status line at the bottom (for terminals only)."""

    def __init__(self, out: IO[bytes], *, on_progress: Optional[ProgressCallback] = None,
                 on_summaries: Optional[SummariesCallback] = None,
                 on_waiting: Optional[WaitingCallback] = None,
                 on_membership: Optional[MembershipCallback] = None,
                 live_status: bool = False) -> None:
        self._out = out
        self._on_progress = on_progress
        self._on_waiting = on_waiting
        self._on_summaries = on_summaries
        self._on_membership = on_membership
        self._live = live_status
        self._status = b""
        self._lock = threading.Lock()

    def attach(self, label: str, name: str, pipe: IO[bytes], log_path: str, *,
               header: bytes = b"") -> threading.Thread:
        """Start copying `pipe` until EOF; returns the (daemon) reader thread. The log
        file is opened for append, so a restarted task's log follows on; `header` (whole
        lines of the launcher's) is written to it first. Blocks only to open the file and
        write `header`; a file that cannot be written is noted, never raised (task_log.py)."""
        log = TaskLog(log_path, label, self.note)
        log.open()
        log.write(header)
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

    def set_live(self, live: bool) -> None:
        """Draw the live status line (a terminal) or not (a file). Writes nothing: when it is
        turned off, the terminal that showed the line may be gone."""
        with self._lock:
            self._live = live
            if not live:
                self._status = b""

    def clear_status(self) -> None:
        """Remove the live status line, e.g. before the final summary."""
        with self._lock:
            if self._live and self._status:
                self._status = b""
                self._write(_CLEAR)

    def _pump(self, prefix: bytes, name: str, pipe: IO[bytes], log: TaskLog) -> None:
        fd = pipe.fileno()
        lines = LineCutter()
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
                log.write(chunk)  # never raises: a broken log file must not stop the console
                self._show(prefix, name, lines.feed(chunk))
            self._show(prefix, name, lines.close())
        finally:
            log.close()  # completes a last line without "\n"
            pipe.close()

    def _show(self, prefix: bytes, name: str, lines: list[bytes]) -> None:
        if not lines:
            return
        self._emit([prefix + line for line in lines])
        if self._on_summaries is not None:
            for line in lines:
                match = SUMMARIES_RE.fullmatch(line.rstrip(b"\r\n")) if b"summaries=" in line else None
                if match:
                    self._on_summaries(name, os.fsdecode(match.group(1)))
        if self._on_waiting is not None:
            for line in lines:
                waited = parse_waiting(line)
                if waited:
                    self._on_waiting(name, waited)
        if self._on_membership is not None:
            for line in lines:
                membership = parse_membership(line)
                if membership is not None:
                    self._on_membership(name, membership)
        if self._on_progress is None:
            return
        for line in reversed(lines):
            progress = parse_progress(line)
            if progress is not None:
                self._on_progress(name, progress)
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
        except (OSError, ValueError):
            pass  # the console went away (EPIPE, or EIO from a hung-up terminal); the log files have it all
