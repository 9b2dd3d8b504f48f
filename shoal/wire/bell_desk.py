"""The server's side of doorbells (the scheme, and the client's side: shoal/wire/doorbell.py):
listening for lines, checking their hellos, and waiting on them and the zmq socket together.

What a process that is not a client can make the server do: connect to its doorbell (an abstract
Unix socket, which anyone in the network namespace can list) and send a hello. The server
accepts at most MAX_UNBOUND such lines at a time, reads at most NONCE_BYTES + 1 bytes of each,
and closes it unless that is the nonce of an area it attached and the kernel names the area's
process as the line's other end; a line that says nothing for HELLO_TIMEOUT_S is closed. A line
of a client that went is closed when its area is let go of.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from dataclasses import dataclass

import zmq

from shoal.wire.doorbell import BELL_MAX_BYTES, BELL_OK, BELL_PREFIX, address_of
from shoal.wire.shared_area import NONCE_BYTES
from shoal.wire.shared_attach import AttachedArea, AttachedAreas

log = logging.getLogger(__name__)

MAX_UNBOUND = 8
HELLO_TIMEOUT_S = 5.0
_UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


@dataclass(eq=False)
class BellLine:
    """One client's line (once its hello named its area: `area`)."""

    sock: socket.socket
    opened: float
    area: AttachedArea | None = None

    def send(self, frame: bytes) -> bool:
        """Send one message without blocking. False if it cannot go now (the client has not read
        the line's earlier messages, or it went): the caller sends it through zmq instead."""
        try:
            self.sock.send(frame, socket.MSG_DONTWAIT)
            return True
        except OSError:
            return False

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
        log.debug("%s: doorbell %s open for clients on this machine", self._server_name, name)

    def wait(self, timeout_ms: int) -> tuple[BellLine, bytes] | bool:
        """Block up to `timeout_ms` for the next message: (line, message) for one that came on a
        line, True when the zmq socket has one (receive it without blocking), False if none came.
        New lines and hellos are taken care of here."""
        ready = dict(self._poller.poll(timeout_ms))
        zmq_ready = self._zsock in ready
        if self._listener.fileno() in ready:
            self._accept()
        if zmq_ready and self._zmq_first:
            self._zmq_first = False
            return True
        for fd in ready:
            line = self._lines.get(fd)
            if line is not None:
                message = self._read(line)
                if message is not None:
                    self._zmq_first = True
                    return line, message
        return zmq_ready

    def sweep(self) -> None:
        """Close lines whose area was let go of and lines that sent no hello in time."""
        now = time.monotonic()
        for line in list(self._lines.values()):
            if line.area.released if line.area is not None else now - line.opened > HELLO_TIMEOUT_S:
                self._close_line(line)

    def close(self) -> None:
        for line in list(self._lines.values()):
            self._close_line(line)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._poller = self._zsock = None
        self.name = None

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if sum(1 for line in self._lines.values() if line.area is None) >= MAX_UNBOUND:
            sock.close()
            log.info("%s: refused a doorbell line: %d lines have not said hello yet", self._server_name, MAX_UNBOUND)
            return
        sock.setblocking(False)
        self._lines[sock.fileno()] = BellLine(sock, time.monotonic())
        self._poller.register(sock.fileno(), zmq.POLLIN)

    def _read(self, line: BellLine) -> bytes | None:
        """The line's next message, or None (nothing yet, a hello taken care of, or the line closed)."""
        size = BELL_MAX_BYTES + 1 if line.area is not None else NONCE_BYTES + 1
        try:
            data = line.sock.recv(size, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data = b""
        if not data or len(data) >= size or (line.area is not None and line.area.released):
            if data:
                log.warning("%s: closed a doorbell line that sent %d bytes, more than it may", self._server_name,
                            len(data))
            self._close_line(line)
            return None
        if line.area is None:
            self._hello(line, data)
            return None
        return data

    def _hello(self, line: BellLine, nonce: bytes) -> None:
        area = self._areas.find(nonce)
        pid, uid, _ = _UCRED.unpack(line.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if area is None or area.pid != pid or uid != os.getuid():
            log.info("%s: refused a doorbell line of pid %d: it named no area of that process", self._server_name,
                     pid)
            self._close_line(line)
            return
        for other in list(self._lines.values()):
            if other.area is area:  # the client rang again: its old line is dead to it
                self._close_line(other)
        line.area = area
        if not line.send(BELL_OK):
            self._close_line(line)
            return
        log.debug("%s: doorbell line up for pid %d", self._server_name, pid)

    def _close_line(self, line: BellLine) -> None:
        fd = line.sock.fileno()
        if fd >= 0 and self._lines.pop(fd, None) is not None:
            self._poller.unregister(fd)
        line.sock.close()  # (its area stays: a deferred reply to one of its requests goes through zmq)
