"""Raw ZMTP 3 bytes, for tests that play a peer zmq would never be: one that stops mid-handshake
or declares a huge frame. See https://rfc.zeromq.org/spec/23/ (ZMTP 3.0)."""

from __future__ import annotations

import errno
import socket
import struct
import threading


def greeting(mechanism: bytes = b"PLAIN") -> bytes:
    """The 64-byte greeting of a ZMTP 3.0 client proposing `mechanism`."""
    return (b"\xff" + b"\0" * 8 + b"\x7f"      # signature
            + b"\x03\x00"                      # version 3.0
            + mechanism.ljust(20, b"\0")       # mechanism, NUL-padded
            + b"\x00"                          # as-server: no
            + b"\0" * 31)                      # filler


def command_header(size: int) -> bytes:
    """Flags (long command frame) and the 8-byte size a command frame of `size` bytes starts with."""
    return b"\x06" + struct.pack(">Q", size)


def send_until_refused(sock: socket.socket, nbytes: int, chunk: int = 1 << 20) -> int:
    """Send up to `nbytes` of filler, stopping when the peer hangs up. Returns the bytes sent."""
    block = b"\xab" * chunk
    sent = 0
    try:
        while sent < nbytes:
            sock.sendall(block[:min(chunk, nbytes - sent)])
            sent += min(chunk, nbytes - sent)
    except OSError:  # the server hung up (EPIPE, ECONNRESET) or stopped reading (timeout)
        pass
    return sent


def half_handshake(address: tuple[str, int], source: str | None = None, timeout_s: float = 5.0) -> socket.socket:
    """A TCP connection that sends a client greeting and then nothing: zmq waits for its HELLO."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    if source is not None:
        sock.bind((source, 0))
    sock.connect(address)
    sock.sendall(greeting())
    return sock


class HalfHandshakes:
    """`count` connections from `source` that greet and then stay silent, as an attacker without
    the secret would hold them. With `reopen`, a thread replaces the ones the server drops every
    `period_s` until `stop()`. Connects are non-blocking, so a full accept queue stalls nothing.
    Not thread-safe apart from `open_count`, `stop`."""

    def __init__(self, target: tuple[str, int], count: int, source: str, reopen: bool = True,
                 period_s: float = 0.5):
        self.target, self.count, self.source, self.reopen, self.period_s = target, count, source, reopen, period_s
        self._slots: list[tuple[socket.socket, bool] | None] = [None] * count
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="half-handshakes", daemon=True)
        self.sweeps = 0   # passes over every connection so far
        self.greeted = 0  # connections that sent their greeting so far, dropped ones included

    def start(self) -> "HalfHandshakes":
        self._thread.start()
        return self

    def open_count(self) -> int:
        """Connections greeted and not (yet) dropped by the server."""
        with self._lock:
            return sum(1 for slot in self._slots if slot is not None and slot[1])

    def take_open(self) -> list[socket.socket]:
        """Hand over the greeted connections still open (the caller closes them); stop tracking them."""
        with self._lock:
            taken = [slot[0] for slot in self._slots if slot is not None and slot[1]]
            self._slots = [slot if slot is not None and not slot[1] else None for slot in self._slots]
        return taken

    def stop(self) -> None:
        """Stop reopening and close every connection. Idempotent; blocks up to a few seconds."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lock:
            for slot in self._slots:
                if slot is not None:
                    slot[0].close()
            self._slots = [None] * self.count

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            with self._lock:
                for i in range(self.count):
                    self._slots[i] = self._step(self._slots[i], first or self.reopen)
            first = False
            self.sweeps += 1
            self._stop.wait(self.period_s)

    def _step(self, slot, may_open: bool):
        if slot is None:
            if not may_open:
                return None
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.bind((self.source, 0))
            except OSError:
                sock.close()
                return None
            sock.connect_ex(self.target)
            slot = (sock, False)
        sock, greeted = slot
        try:
            if not greeted:
                sock.send(greeting())
                self.greeted += 1
                return sock, True
            if sock.recv(4096) == b"":  # the server hung up
                sock.close()
                return None
        except BlockingIOError:
            pass  # still connecting, or nothing to read: alive
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.EALREADY, errno.EINPROGRESS):
                return slot
            sock.close()
            return None
        return slot
