"""The server's side of doorbells (the scheme, and the client's side: shoal/wire/doorbell.py):
listening for lines, checking who rings, and waiting on the lines and the zmq socket together.

What a process that is not a client can make the server do: connect to its doorbell (an abstract
Unix socket, which anyone in the network namespace can list). The kernel names the process at
the other end of each line (SO_PEERCRED): a line of another user, or of a process that holds no
area the server attached, is hung up on at once, unread (refusals are logged rate-limited). Of
the rest the server holds at most MAX_UNBOUND lines that have not said hello, reads at most
NONCE_BYTES + 1 bytes of each, and hangs up unless that is the nonce of that process's area, or
if nothing came within HELLO_TIMEOUT_S (checked every SWEEP_EVERY_S). A line is closed when its
area is let go of (its client reset or exited).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

import zmq

from shoal.wire.doorbell import BELL_MAX_BYTES, BELL_OK, BELL_PREFIX, Sent, address_of, peer_of, receive_now, send_now
from shoal.wire.refusals import RefusalLog
from shoal.wire.shared_area import NONCE_BYTES
from shoal.wire.shared_attach import AttachedArea, AttachedAreas

log = logging.getLogger(__name__)

MAX_UNBOUND = 8
HELLO_TIMEOUT_S = 5.0
SWEEP_EVERY_S = 1.0


@dataclass(eq=False)
class BellLine:
    """One client's line (once its hello named its area: `area`)."""

    sock: socket.socket
    pid: int
    opened: float
    area: AttachedArea | None = None

    def send(self, frame: bytes) -> bool:
        """Send one message without blocking. False if it cannot go now (the client has not read
        the line's earlier messages, or it went): the caller sends it through zmq instead."""
        return send_now(self.sock, frame) is Sent.SENT

    def zmq_peer(self) -> bytes | None:
        """The zmq routing id of this line's client, for a reply that cannot go on the line."""
        return self.area.peer if self.area is not None else None


class BellDesk:
    """A server's doorbell: opened at the first area it attaches, so a server of clients on other
    machines alone never listens on one (and keeps its single blocking receive on zmq).

    Not thread-safe: the serving thread's. `close` is idempotent.
    """

    def __init__(self, server_name: str, areas: AttachedAreas):
        self._server_name = server_name
        self._areas = areas
        self.name: str | None = None
        self._listener: socket.socket | None = None
        self._poller: zmq.Poller | None = None
        self._zsock: zmq.Socket | None = None
        self._lines: dict[int, BellLine] = {}  # by file descriptor (what zmq's poll names them by)
        self._zmq_first = True  # whose message is taken when both have one (they take turns)
        self._turn = 0  # which of several ready lines goes first (they take turns too)
        self._next_sweep = 0.0
        self._refusals = RefusalLog(log, f"{server_name} (doorbell)")

    @property
    def active(self) -> bool:
        return self._listener is not None

    def open(self, zsock: zmq.Socket) -> None:
        """Listen on a new abstract address (`name`). Idempotent. Raises OSError if it cannot."""
        if self._listener is not None:
            return
        name = BELL_PREFIX + os.urandom(16).hex()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            listener.bind(address_of(name))
            listener.listen(MAX_UNBOUND)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._poller = zmq.Poller()
        self._poller.register(zsock, zmq.POLLIN)
        self._poller.register(listener.fileno(), zmq.POLLIN)
        self._zsock, self._listener, self.name = zsock, listener, name
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        log.debug("%s: doorbell %s open for clients on this machine", self._server_name, name)

    def wait(self, timeout_ms: int) -> tuple[BellLine, bytes] | bool:
        """Block up to `timeout_ms` for the next message: (line, message) for one that came on a
        line, True when the zmq socket has one (receive it without blocking), False if none came.
        New lines and hellos are taken care of here; so are lines past their time, every
        SWEEP_EVERY_S (a clock read otherwise)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        ready = self._poller.poll(timeout_ms)
        if not ready:
            return False
        zmq_ready = False
        lines = []
        for fd, _ in ready:
            if fd is self._zsock:
                zmq_ready = True
            elif fd == self._listener.fileno():
                self._accept()
            elif fd in self._lines:
                lines.append(self._lines[fd])
        if zmq_ready and (self._zmq_first or not lines):
            self._zmq_first = False
            return True
        self._turn += 1
        for k in range(len(lines)):
            line = lines[(self._turn + k) % len(lines)]
            message = self._read(line)
            if message is not None:
                self._zmq_first = True
                return line, message
        return zmq_ready

    def queued(self, area: AttachedArea):
        """The messages waiting on `area`'s line, in order (a request its client sent through zmq
        after them is handled after them). Yields (line, message)."""
        for line in list(self._lines.values()):
            if line.area is area:
                while (message := self._read(line)) is not None:
                    yield line, message

    def close(self) -> None:
        for line in list(self._lines.values()):
            self._close_line(line)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._poller = self._zsock = None
        self.name = None

    def _sweep(self, now: float) -> None:
        """Close lines whose area was let go of and lines that sent no hello in time."""
        self._next_sweep = now + SWEEP_EVERY_S
        for line in list(self._lines.values()):
            if line.area.released if line.area is not None else now - line.opened > HELLO_TIMEOUT_S:
                self._close_line(line)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        try:
            pid, uid = peer_of(sock)
        except OSError:
            sock.close()
            return
        reason = None
        if uid != os.getuid():
            reason = f"it is another user's (uid {uid})"
        elif not self._areas.held_by(pid):
            reason = "that process holds no area this server attached"
        elif sum(1 for line in self._lines.values() if line.area is None) >= MAX_UNBOUND:
            reason = f"{MAX_UNBOUND} lines have not said hello yet"
        if reason is not None:
            sock.close()
            self._refusals.refused(f"pid {pid}", f"a doorbell line: {reason}", time.monotonic())
            return
        sock.setblocking(False)
        self._lines[sock.fileno()] = BellLine(sock, pid, time.monotonic())
        self._poller.register(sock.fileno(), zmq.POLLIN)

    def _read(self, line: BellLine) -> bytes | None:
        """The line's next message, or None (nothing yet, a hello taken care of, or the line closed)."""
        size = BELL_MAX_BYTES + 1 if line.area is not None else NONCE_BYTES + 1
        data = receive_now(line.sock, size)
        if data is None:
            return None
        if not data or len(data) >= size or (line.area is not None and line.area.released):
            if data and len(data) >= size:
                self._refusals.refused(f"pid {line.pid}", f"a doorbell line sent {len(data)} bytes, more than it may",
                                       time.monotonic())
            self._close_line(line)
            return None
        if line.area is None:
            self._hello(line, data)
            return None
        return data

    def _hello(self, line: BellLine, nonce: bytes) -> None:
        area = self._areas.find(nonce)
        if area is None or area.pid != line.pid:
            self._refusals.refused(f"pid {line.pid}", "a doorbell hello that names no area of that process",
                                   time.monotonic())
            self._close_line(line)
            return
        for other in list(self._lines.values()):
            if other.area is area:  # the client rang again: its old line is dead to it
                self._close_line(other)
        line.area = area
        if not line.send(BELL_OK):
            self._close_line(line)
            return
        log.debug("%s: doorbell line up for pid %d", self._server_name, line.pid)

    def _close_line(self, line: BellLine) -> None:
        fd = line.sock.fileno()
        if fd >= 0 and self._lines.pop(fd, None) is not None:
            self._poller.unregister(fd)
        line.sock.close()  # (its area stays: a deferred reply to one of its requests goes through zmq)

