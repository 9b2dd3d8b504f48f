"""A doorbell: the direct line between a client and a server on one machine, for messages that
are a header alone (the server's side is shoal/wire/bell_desk.py).

Through zmq a request and its reply each wake four threads: the client's, its zmq I/O thread, the
server's I/O thread and the server's (bench/README.md, "The tiny request, per thread"). Between
two processes of one machine a Unix socket wakes only the other end: a header-only round trip
costs about half of a bare zmq one on our 2-core machine (70 against 158 us).

Once a server has attached a client's shared-memory area (shoal/wire/shared_area.py), tensors
travel in the area and a request is its header alone. The server then names its doorbell in its
replies (`BELL_KEY`: an abstract Unix socket address of its network namespace). The client
connects and sends the area's nonce (`hello`): the server keeps the line only if that nonce
names an area it attached, and the process at the other end (the kernel says which, SO_PEERCRED)
is the one whose area it is. It answers `BELL_OK` and from then on:

- a request that is a header alone, of at most BELL_MAX_BYTES, goes on the line (without
  blocking) while no request of the client waits for a reply through zmq and zmq's connection
  is up;
- a reply that is a header alone goes back on the line; one with tensors that did not fit the
  request's block goes through zmq, as before (to the client's own routing id, which zmq keeps
  when it connects again).

A request that cannot go on the line (too big, the line full, zmq's connection down) goes through
zmq, naming the area if requests are out on the line: the server handles what waits on that line
first, so one client's requests are handled in the order sent.

The line is a SOCK_SEQPACKET socket: the kernel keeps message boundaries and a message is sent
whole or not at all. When the server goes (it exited, or hung up), the client reads what is left
on the line and hangs up; zmq's monitor reports requests still out as lost (PeerLostError), and
its next requests go through zmq until a server names a doorbell again.
"""

from __future__ import annotations

import enum
import os
import socket
import struct

BELL_KEY = "bell"  # reply header, to a request that named an attached area: the server's doorbell address
BELL_PREFIX = "shoal-bell-"  # doorbell addresses are abstract names: b"\0" + BELL_PREFIX + 32 hex digits
BELL_OK = b"bell-ok"  # the server's answer to an accepted hello, the first message on a line
BELL_MAX_BYTES = 32 << 10  # a bigger header goes through zmq
UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid of the process at the other end
_HEX = frozenset("0123456789abcdef")


def valid_name(name) -> bool:
    """Whether `name` (a reply's BELL_KEY field) is a doorbell address a server makes."""
    return (type(name) is str and len(name) == len(BELL_PREFIX) + 32 and name.startswith(BELL_PREFIX)
            and set(name[len(BELL_PREFIX):]) <= _HEX)


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket, as the kernel says."""
    pid, uid, _ = UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
    return pid, uid


def receive_now(sock: socket.socket, size: int) -> bytes | None:
    """The next message on a line, of at most `size` bytes, if one is queued; None if none is;
    b"" at the end of the line (the other end went or hung up). Does not block."""
    try:
        return sock.recv(size, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def send_now(sock: socket.socket, frame: bytes) -> Sent:
    """Send one message on a line without blocking: SENT, FULL (the other end has not read the
    line's earlier messages) or GONE (it went or hung up). Nothing was sent unless SENT."""
    try:
        sock.send(frame, socket.MSG_DONTWAIT)
        return Sent.SENT
    except (BlockingIOError, InterruptedError):
        return Sent.FULL
    except OSError:
        return Sent.GONE


def address_of(name: str) -> bytes:
    """The abstract socket address of doorbell `name` (not a file: it vanishes with its socket)."""
    return b"\0" + name.encode("ascii")


class Sent(enum.Enum):
    """What became of a message sent on a line."""

    SENT = "sent"
    FULL = "full"  # the server has not read the line's earlier messages: send it another way
    GONE = "gone"  # the line is gone: nothing more goes on it


class BellState(enum.Enum):
    """RINGING -> UP (the server answered BELL_OK) -> GONE; RINGING -> GONE (refused, or the
    server went). Only an UP line carries requests."""

    RINGING = "ringing"
    UP = "up"
    GONE = "gone"


class Doorbell:
    """The client's end of one line to a server. Not thread-safe (the client's thread)."""

    def __init__(self, name: str):
        self.name = name
        self.state = BellState.GONE
        self._sock: socket.socket | None = None

    def ring(self, nonce: bytes) -> bool:
        """Connect and send the hello (`nonce`, the area's), if the socket that listens under the
        name is a process of this user's (a name a server let go of can be taken by anyone).
        Does not wait for the answer: it comes as the line's first message (`receive`). False
        if the server cannot be reached. Does not block (a Unix socket connects at once, or fails)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.connect(address_of(self.name))
            if peer_of(sock)[1] != os.getuid():
                raise ConnectionRefusedError(f"doorbell {self.name} is another user's")
            sock.send(nonce)
        except OSError:
            sock.close()
            return False
        self._sock = sock
        self.state = BellState.RINGING
        return True

    def fileno(self) -> int:
        return self._sock.fileno() if self._sock is not None else -1

    def send(self, frame: bytes) -> Sent:
        """Send one message (a header of at most BELL_MAX_BYTES) without blocking: SENT, FULL
        (the server has not read the line's earlier messages) or GONE (the server went or hung
        up; read what is left on the line, then `close`). Nothing was sent unless SENT."""
        return send_now(self._sock, frame) if self._sock is not None else Sent.GONE

    def receive(self) -> bytes | None:
        """The next message if one is queued (non-blocking); None if none is. A RINGING line
        becomes UP on BELL_OK, and None is returned for it. At the end of the line (the server
        went, or refused the hello), the line is closed and None returned: check `state`."""
        if self._sock is None:
            return None
        data = receive_now(self._sock, BELL_MAX_BYTES)
        if data is None:
            return None
        if not data or (self.state is BellState.RINGING and data != BELL_OK):
            self.close()
            return None
        if self.state is BellState.RINGING:
            self.state = BellState.UP
            return None
        return data

    def close(self) -> None:
        """Hang up. Idempotent."""
        self.state = BellState.GONE
        if self._sock is not None:
            self._sock.close()
            self._sock = None
