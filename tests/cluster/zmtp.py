"""Raw ZMTP 3 bytes, for tests that play a peer zmq would never be: one that stops mid-handshake
or declares a huge frame. See https://rfc.zeromq.org/spec/23/ (ZMTP 3.0)."""

from __future__ import annotations

import socket
import struct


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
