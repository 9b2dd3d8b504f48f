"""A client's shared-memory area: where the tensors of its requests to a server on this machine,
and the server's replies to them, travel instead of through the socket.

Over loopback TCP a tensor is copied four times each way (into zmq's buffer, into the kernel,
out of it, out of zmq's buffer) and wakes both processes' zmq I/O threads; through a shared area
it is copied twice (into the area, out of it) and only the header goes through the socket. A
400 KB push and its reply cost each side about half the CPU (bench/README.md, "Shared memory
between tasks on one machine").

How an area comes to be shared (the server's side is shoal/wire/shared_attach.py):

1. The client creates an anonymous memory file (memfd), sealed against shrinking (a server
   that maps it can never fault on a page that went away), maps it and writes a random nonce
   into its first page.
2. Its requests with tensors name the area (`OFFER_KEY`: pid, fd, size, nonce). The server opens
   the file through /proc/<pid>/fd/<fd> and attaches it only if it is such a sealed memfd of its
   own user whose nonce matches (a client in another pid namespace, or behind a forwarded port,
   names some other file, and is refused), and answers in the reply (`ACK_KEY`). The server
   keeps the area by its nonce, not by connection: a connection zmq made again after a drop
   (a new routing id, a restarted server) finds it, or attaches it again, from the request.
3. Once the server said yes, a request whose tensors are big enough gets a block of the area:
   the tensors are written into it (the header says where, `BLOCK_KEY`), the server reads them
   there and writes its reply's tensors back into the same block when they fit. The block is
   the client's again once the reply is read; every request in flight has its own.

Only a client of a server in its own network namespace offers one: a loopback address, or an
address of one of its interfaces (a worker next to its ps on a host of a multi-host job). A
server elsewhere could not attach it, and tests put "hosts" in network namespaces of one machine,
whose servers could: their addresses are not local to each other, so they keep to the socket.
Closing the area leaves it to the kernel: the memory is freed once the server has unmapped it
too.
"""

from __future__ import annotations

import enum
import mmap
import os
import secrets
from dataclasses import dataclass
from typing import Mapping

import numpy as np

try:
    import fcntl
except ImportError:  # not a POSIX system: no shared areas (supported() says so)
    fcntl = None  # type: ignore[assignment]

OFFER_KEY = "shm_offer"  # request header: {"pid", "fd", "size", "nonce"}, the area it may use
ACK_KEY = "shm_ok"  # reply header, to a request that named an area: whether the server attached it
BLOCK_KEY = "m"  # message header: [offset, nbytes] of the block holding the tensors
MEMFD_NAME = "shoal-wire"
NONCE_BYTES = 16
PAGE = 4096  # the first page holds the nonce; blocks start on page boundaries
ALIGN = 64  # each tensor of a block starts on a cache line
AREA_BYTES = 64 << 20  # address space; pages are only used once touched (blocks fill from the start)
MIN_SHARED_BYTES = 1 << 10  # below this a request's tensors go through the socket


def supported() -> bool:
    """Whether this system can share areas (Linux memfds with seals)."""
    return (hasattr(os, "memfd_create") and hasattr(os, "MFD_ALLOW_SEALING") and hasattr(fcntl, "F_ADD_SEALS")
            and os.path.isdir("/proc/self/fd"))


def seals() -> int:
    """The seals an area carries: it can neither shrink (a page that went away would kill the
    server that maps it, SIGBUS) nor grow, and no seal can be removed."""
    return fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def packed_nbytes(tensors: Mapping[str, np.ndarray]) -> int:
    """Bytes a block needs for `tensors`, each starting on an ALIGN boundary."""
    return sum(-(-a.nbytes // ALIGN) * ALIGN for a in tensors.values())


class AreaState(enum.Enum):
    """NONE -> OFFERED (created; named in requests) -> ATTACHED (the server said yes) or
    REFUSED (it said no, or answered an offering request without saying: an older server).
    A REFUSED client sends through the socket until its connection is reset (back to NONE)."""

    NONE = "none"
    OFFERED = "offered"
    ATTACHED = "attached"
    REFUSED = "refused"


@dataclass(frozen=True)
class Block:
    """Bytes [offset, offset + nbytes) of an area, given to one request."""

    offset: int
    nbytes: int


class SharedArea:
    """A client's area and the blocks of its requests in flight.

    Not thread-safe (it belongs to one RpcClient). The constructor does no I/O; `open` creates
    the memfd; `close` is idempotent.
    """

    def __init__(self, nbytes: int = AREA_BYTES):
        self.nbytes = nbytes
        self.state = AreaState.NONE
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._offer: dict = {}
        self._blocks: dict[int, Block] = {}  # request id -> its block

    def open(self) -> None:
        """Create, seal and map the memfd (state OFFERED). Raises OSError if the system cannot."""
        fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, self.nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals())
            self._map = mmap.mmap(fd, self.nbytes)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        nonce = secrets.token_bytes(NONCE_BYTES)
        self._map[:NONCE_BYTES] = nonce
        self._offer = {"pid": os.getpid(), "fd": fd, "size": self.nbytes, "nonce": nonce}
        self.state = AreaState.OFFERED

    def offer(self) -> dict:
        """The header field that names this area to the server (every request that may use it)."""
        return self._offer

    def answered(self, attached: bool | None) -> None:
        """The server's answer to an offer (None: it answered an offering request without one)."""
        if self.state is not AreaState.OFFERED:
            return
        if attached:
            self.state = AreaState.ATTACHED
        else:
            self.refused()

    def refused(self) -> None:
        """The server said no (to an offer, or later: a server started again that cannot attach
        it): close the area; requests go through the socket until the connection is reset."""
        self.close()
        self.state = AreaState.REFUSED

    def allocate(self, rid: int, nbytes: int) -> Block | None:
        """A block of at least `nbytes` for request `rid`, or None if the area has no room (the
        request then goes through the socket). First fit, from the start of the area."""
        size = -(-nbytes // PAGE) * PAGE
        start = PAGE
        for block in sorted(self._blocks.values(), key=lambda b: b.offset):
            if block.offset - start >= size:
                break
            start = max(start, block.offset + block.nbytes)
        if start + size > self.nbytes:
            return None
        block = self._blocks[rid] = Block(start, size)
        return block

    def free(self, rid: int) -> None:
        """Request `rid`'s block (if it had one) is free again: its reply was read."""
        self._blocks.pop(rid, None)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Writable bytes of a block (a request's, or its reply's). Raises ValueError if they
        are not inside the area."""
        if not (PAGE <= offset and nbytes >= 0 and offset + nbytes <= self.nbytes):
            raise ValueError(f"bytes {offset}..{offset + nbytes} are outside the shared area of {self.nbytes} bytes")
        return memoryview(self._map)[offset:offset + nbytes]

    def close(self) -> None:
        """Unmap and close (the server keeps its own mapping until it lets go). Idempotent."""
        self._blocks.clear()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.state = AreaState.NONE
