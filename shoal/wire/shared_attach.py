"""The server's side of shared-memory areas (the client's, and the whole scheme:
shoal/wire/shared_area.py): attaching an offered area, reading request tensors from it and
writing reply tensors into it, and letting go of areas whose client is gone.

What an authenticated peer can make the server do: open a file through /proc/<pid>/fd/<fd> of a
process of the server's own user, and map it only if it is a memfd named like ours, sealed
against shrinking, of at most MAX_AREA_BYTES, whose first bytes hold the nonce of the offer. A
server maps at most MAX_AREAS areas; their pages belong to the clients' memfds (mapping costs
the server address space, not memory). Each attachment is checked every SWEEP_EVERY_S: once
its client closed the memfd (its connection was reset) or exited, the server lets go of it.
"""

from __future__ import annotations

import fcntl
import hmac
import logging
import mmap
import os
import stat
import time
from dataclasses import dataclass, field

from shoal.wire.shared_area import MEMFD_NAME, NONCE_BYTES, PAGE

log = logging.getLogger(__name__)

MAX_AREA_BYTES = 1 << 30
MAX_AREAS = 64
SWEEP_EVERY_S = 2.0


@dataclass
class AttachedArea:
    """One client's area as this server maps it."""

    pid: int
    fd: int
    identity: tuple[int, int]  # (st_dev, st_ino) of the memfd: it is the same file while these match
    map: mmap.mmap = field(repr=False)

    @property
    def nbytes(self) -> int:
        return len(self.map)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Bytes [offset, offset + nbytes) of the area. Raises ValueError outside it (the
        client's header is not trusted)."""
        if not (type(offset) is int and type(nbytes) is int and PAGE <= offset and nbytes >= 0
                and offset + nbytes <= len(self.map)):
            raise ValueError(f"bytes {offset!r}..{offset!r}+{nbytes!r} are outside the shared area "
                             f"of {len(self.map)} bytes")
        return memoryview(self.map)[offset:offset + nbytes]

    def alive(self) -> bool:
        """Whether the client still holds the memfd (same process, same fd, same file)."""
        try:
            st = os.stat(f"/proc/{self.pid}/fd/{self.fd}")
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def release(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a request's tensors still view it: the mapping goes with them
            pass


class AttachedAreas:
    """The areas attached for this server's peers (zmq routing ids).

    Not thread-safe: the serving thread's. `close` is idempotent.
    """

    def __init__(self, server_name: str = "server"):
        self._name = server_name
        self._areas: dict[bytes, AttachedArea] = {}
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S

    def __len__(self) -> int:
        return len(self._areas)

    def get(self, peer: bytes) -> AttachedArea | None:
        return self._areas.get(peer)

    def offer(self, peer: bytes, offer) -> bool:
        """Attach the area `offer` (a request header's OFFER_KEY field) for `peer`. Returns
        whether it is attached; never raises for a bad offer (it is refused and logged)."""
        current = self._areas.get(peer)
        try:
            pid, fd, size, nonce = _fields(offer)
            if current is not None and (current.pid, current.fd) == (pid, fd):
                return True  # offered again by a request sent before the answer arrived
            if len(self._areas) >= MAX_AREAS:
                self.sweep(force=True)
            if len(self._areas) >= MAX_AREAS:
                raise ValueError(f"{MAX_AREAS} areas are attached already")
            area = _attach(pid, fd, size, nonce)
        except (OSError, ValueError) as e:
            log.debug("%s: refused a shared-memory area offered by a peer: %s", self._name, e)
            return False
        if current is not None:
            current.release()
        self._areas[peer] = area
        log.info("%s: a client on this machine (pid %d) sends its tensors through shared memory", self._name, pid)
        return True

    def sweep(self, force: bool = False) -> None:
        """Let go of areas whose client closed them or exited; at most every SWEEP_EVERY_S
        unless `force`. Cheap when not due (one clock read)."""
        now = time.monotonic()
        if not force and now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for peer, area in list(self._areas.items()):
            if not area.alive():
                area.release()
                del self._areas[peer]

    def close(self) -> None:
        for area in self._areas.values():
            area.release()
        self._areas.clear()


def _fields(offer) -> tuple[int, int, int, bytes]:
    if type(offer) is not dict:
        raise ValueError(f"an offer must be a map, got {type(offer).__name__}")
    pid, fd, size, nonce = offer.get("pid"), offer.get("fd"), offer.get("size"), offer.get("nonce")
    if not (type(pid) is int and pid > 0 and type(fd) is int and fd >= 0 and type(size) is int
            and PAGE < size <= MAX_AREA_BYTES and type(nonce) is bytes and len(nonce) == NONCE_BYTES):
        raise ValueError(f"bad offer fields pid={pid!r:.20} fd={fd!r:.20} size={size!r:.20}")
    return pid, fd, size, nonce


def _attach(pid: int, fd: int, size: int, nonce: bytes) -> AttachedArea:
    path = f"/proc/{pid}/fd/{fd}"
    target = os.readlink(path)
    if not target.startswith(f"/memfd:{MEMFD_NAME} "):
        raise ValueError(f"{path} is not a shared area ({target[:80]!r})")
    own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(own)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
            raise ValueError(f"{path} is not a {size}-byte file of this user")
        if fcntl.fcntl(own, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK == 0:
            raise ValueError(f"{path} is not sealed against shrinking")
        area = mmap.mmap(own, size)
    finally:
        os.close(own)
    if not hmac.compare_digest(area[:NONCE_BYTES], nonce):
        area.close()
        raise ValueError(f"{path} does not hold the offer's nonce (another machine's or process's file)")
    return AttachedArea(pid, fd, (st.st_dev, st.st_ino), area)
