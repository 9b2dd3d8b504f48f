"""What a peer may cost a server before it has proved it holds the job secret.

zmq reads a frame's declared size during the handshake, before the password is checked, and
used to allocate and fill a buffer of that size (issue 10, F2). Shoal never sends a frame larger
than MAX_FRAME_BYTES (tensors travel in CHUNK_BYTES chunks, headers are at most
MAX_HEADER_BYTES), so every socket refuses larger frames, and a handshake that has not finished
within `handshake_timeout_s` is dropped. A server also bounds how many connections that have
not authenticated each peer address (and all of them together) may hold (the Gatekeeper,
shoal/wire/gatekeeper.py), and raises its open-file limit, so that such connections can cost it
at most about `unauthenticated_total * max_frame_bytes` of memory and never the descriptors a
restarted worker needs (issue 10, W7). See docs/wire-protocol.md, "Limits on unauthenticated
peers".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq

from shoal.wire.errors import WireError
from shoal.wire.message import CHUNK_BYTES, MAX_HEADER_BYTES

# CURVE wraps each frame in a MESSAGE command: 33 bytes of name, nonce, flags and MAC.
_MECHANISM_OVERHEAD_BYTES = 4096
MAX_FRAME_BYTES = max(CHUNK_BYTES, MAX_HEADER_BYTES) + _MECHANISM_OVERHEAD_BYTES
# Where the hard limit is "unlimited", the soft limit cannot be: Linux caps it at fs.nr_open
# (1048576 by default), macOS at OPEN_MAX (10240).
_UNLIMITED_FALLBACKS = (1 << 20, 10240)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds a server puts on its peers. The defaults suit every Shoal job; tests shrink them.

    max_frame_bytes              largest frame zmq accepts, before or after authentication
    handshake_timeout_s          a connection that has not authenticated by then is dropped
    unauthenticated_per_address  most connections one peer address may hold before they
                                 authenticate; over it, the oldest of them is dropped
    unauthenticated_total        the same for all addresses together

    Worst case, connections that never authenticate hold `unauthenticated_total` buffers of up
    to `max_frame_bytes` each (`unauthenticated_per_address` of them for one address), each for
    at most `handshake_timeout_s`.
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    handshake_timeout_s: float = 10.0
    unauthenticated_per_address: int = 8
    unauthenticated_total: int = 32

    def __post_init__(self) -> None:
        if self.max_frame_bytes < MAX_FRAME_BYTES:
            raise WireError(f"max_frame_bytes={self.max_frame_bytes} is below the {MAX_FRAME_BYTES} bytes "
                            "Shoal's own frames may take; leave it at its default")
        if not self.handshake_timeout_s > 0:
            raise WireError(f"handshake_timeout_s={self.handshake_timeout_s!r} must be a positive number of seconds")
        if not 1 <= self.unauthenticated_per_address <= self.unauthenticated_total:
            raise WireError(f"unauthenticated_per_address={self.unauthenticated_per_address} must be at least 1 and "
                            f"at most unauthenticated_total={self.unauthenticated_total}")

    def apply(self, sock: zmq.Socket) -> None:
        """Set the frame size and handshake limits on `sock` (before it binds or connects)."""
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.handshake_timeout_s * 1000))


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as servers that hold many
    connections do; returns the soft limit now in force (-1 where there is none to raise).
    Process-wide. Does not block; not thread-safe."""
    try:
        import resource
    except ImportError:  # Windows
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    targets = (hard,) if hard != resource.RLIM_INFINITY else _UNLIMITED_FALLBACKS
    for target in targets:
        if soft != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        log.debug("raised the open-file limit from %s to %s", soft, target)
        return target
    return soft
