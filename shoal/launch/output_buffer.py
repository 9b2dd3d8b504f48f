"""`OutputBuffer`: one remote task's output on its way from the agent connection's reader thread
to the console (issue 11).

The reader thread also handles the agent's heartbeats, exits and replies, so it must never wait
for a console that cannot keep up: `put` never blocks. The buffer holds at most `limit_bytes`;
past that the oldest output is dropped and counted, and where it was dropped the consumer gets one
line saying how many bytes went and why, so the task's log shows the gap.
"""

from __future__ import annotations

import collections
import threading
from typing import Optional

DEFAULT_LIMIT_BYTES = 8 * 1024 * 1024
"""How much of one task's output the launcher holds for a console that falls behind."""
CHUNK_OVERHEAD_BYTES = 64
"""What a held chunk costs beyond its bytes (the bytes object and its deque slot), counted
against the limit so that many tiny chunks (a task flushing short lines) stay bounded too."""


class OutputBuffer:
    """Output chunks of task `task`, oldest first, up to `limit_bytes` counting
    CHUNK_OVERHEAD_BYTES per chunk (a single larger chunk is kept whole, alone). `put` and `end` never block; `get` blocks until a chunk or the end.
    Thread-safe: one producer and one consumer (or more of each). No I/O."""

    def __init__(self, task: str, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        if limit_bytes < 1:
            raise ValueError(f"an output buffer's limit must be at least 1 byte, got {limit_bytes!r}")
        self.task = task
        self.limit_bytes = limit_bytes
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._gap = 0  # bytes dropped just before the oldest chunk held, not yet reported
        self._ended = False
        self._mid_line = False  # the last chunk `get` returned did not end its line
        self._put_mid_line = False  # the last chunk `put` did not end its line
        self._ready = threading.Condition()
        self.dropped = 0
        """Bytes of output dropped so far, in all."""

    def put(self, chunk: bytes) -> None:
        """Append `chunk`, dropping the oldest chunks held if it does not fit. Never blocks.
        Ignored after `end`."""
        with self._ready:
            if self._ended:
                return
            if chunk:
                self._put_mid_line = not chunk.endswith(b"\n")
            self._chunks.append(chunk)
            self._held += len(chunk) + CHUNK_OVERHEAD_BYTES
            while self._held > self.limit_bytes and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._held -= len(old) + CHUNK_OVERHEAD_BYTES
                self._gap += len(old)
                self.dropped += len(old)
            self._ready.notify()

    def put_line(self, line: bytes) -> None:
        """Append `line` (a note of the launcher's, ending in a newline) on a line of its own:
        after a newline if the output put so far ends inside a line. Never blocks."""
        with self._ready:
            start = b"\n" if self._put_mid_line else b""
        self.put(start + line)

    def end(self) -> None:
        """No more output: `get` returns None once what is held was read. Idempotent."""
        with self._ready:
            self._ended = True
            self._ready.notify_all()

    def get(self) -> Optional[bytes]:
        """The next chunk (first a note on output dropped before it, if any), or None after `end`
        once everything was read. Blocks until one of them."""
        with self._ready:
            while not self._chunks and not self._gap and not self._ended:
                self._ready.wait()
            if self._gap:
                gap, self._gap = self._gap, 0
                note = dropped_note(self.task, gap, self.limit_bytes)
                note, self._mid_line = (b"\n" + note if self._mid_line else note), False  # a line of its own
                return note
            if self._chunks:
                chunk = self._chunks.popleft()
                self._held -= len(chunk) + CHUNK_OVERHEAD_BYTES
                self._mid_line = not chunk.endswith(b"\n")
                return chunk
            return None


def dropped_note(task: str, dropped: int, limit_bytes: int) -> bytes:
    """The line a task's log gets where its output was dropped."""
    return (f"shoal: dropped {dropped} bytes of {task}'s output: the console could not keep up "
            f"(the launcher holds at most {limit_bytes} bytes of it)\n").encode()
