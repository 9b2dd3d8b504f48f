"""What a peer may cost a server before it has proved it holds the job secret.

zmq reads a frame's declared size during the handshake, before the password is checked, and
used to allocate and fill a buffer of that size (issue 10, F2). Shoal never sends a frame larger
than MAX_FRAME_BYTES (tensors travel in CHUNK_BYTES chunks, headers are at most
MAX_HEADER_BYTES), so every socket refuses larger frames, and a handshake that has not finished
within `handshake_timeout_s` is dropped. See docs/wire-protocol.md, "Limits on unauthenticated
peers".
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from shoal.wire.errors import WireError
from shoal.wire.message import CHUNK_BYTES, MAX_HEADER_BYTES

# CURVE wraps each frame in a MESSAGE command: 33 bytes of name, nonce, flags and MAC.
_MECHANISM_OVERHEAD_BYTES = 4096
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAX_HEADER_BYTES) + _MECHANISM_OVERHEAD_BYTES


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds a server puts on its peers. The defaults suit every Shoal job; tests shrink them.

    max_frame_bytes       largest frame zmq accepts, before or after authentication
    handshake_timeout_s   a connection that has not authenticated by then is dropped
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    handshake_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_frame_bytes < MAX_FRAME_BYTES:
            raise WireError(f"max_frame_bytes={self.max_frame_bytes} is below the {MAX_FRAME_BYTES} bytes "
                            "Shoal's own frames may take; leave it at its default")
        if not self.handshake_timeout_s > 0:
            raise WireError(f"handshake_timeout_s={self.handshake_timeout_s!r} must be a positive number of seconds")

    def apply(self, sock: zmq.Socket) -> None:
        """Set the frame size and handshake limits on `sock` (before it binds or connects)."""
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.handshake_timeout_s * 1000))
