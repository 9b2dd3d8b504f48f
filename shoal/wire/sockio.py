"""Sending and receiving one multipart message with as few calls into pyzmq as it takes.

pyzmq's send_multipart and recv_multipart check every frame and ask the socket for RCVMORE
after each one; for a header-only request that costs more than the request itself. These do
the same with the frame's own `more` flag and no checks (frames are bytes or buffers).
"""

from __future__ import annotations

from typing import Sequence

import zmq

NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
# Frames smaller than this are copied into zmq's buffers rather than sent zero-copy: pyzmq
# tells its garbage-collector thread when zmq is done with each zero-copy frame (a thread
# wake-up, and Python code that takes the GIL), which costs more than copying the frame up to
# about this size (bench/README.md, "Zero-copy or copy": copied, a 400 KB push cost the ps 16%
# and the client 12% less CPU, medians of 6 alternating runs).
ZERO_COPY_MIN_BYTES = 2 << 20


def send_message(sock: zmq.Socket, frames: Sequence, copied: int, flags: int = 0) -> None:
    """Send `frames` as one message; the first `copied` frames are copied into zmq's own
    buffers (small ones: a peer id, a header), the rest are sent zero-copy when at least
    ZERO_COPY_MIN_BYTES (the caller keeps them unchanged until zmq has sent them), else
    copied. Blocks only if zmq has no room for the message (a DEALER with no connection to queue
    it on, or its queue full); with `flags` NOBLOCK it raises zmq.Again then, having sent
    nothing (zmq takes or refuses a message at its first frame)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = _SNDMORE if i < last else 0
        sock.send(frame, more | flags if i == 0 else more, copy=i < copied or len(frame) < ZERO_COPY_MIN_BYTES)


def recv_message(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """The frames of the next message (zero-copy zmq.Frames). With NOBLOCK, raises zmq.Again
    if none is queued; zmq delivers a message's frames together, so only the first can."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames
