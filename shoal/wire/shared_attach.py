"""The server's side of shared-memory areas (the client's, and the whole scheme:
shoal/wire/shared_area.py): attaching an area a request names, and letting go of areas whose
client is gone.

What an authenticated peer can make the server do: open a file through /proc/<pid>/fd/<fd> of a
process of the server's own user (non-blocking, never as a controlling terminal), and map it
only if it is a memfd named like ours, sealed against shrinking, of the size clients make
(AREA_BYTES), whose first bytes hold the nonce the request names. A server maps at most
MAX_AREAS areas; their pages belong to the clients' memfds. Areas are kept by nonce, not by
connection, so a client whose connection zmq made again uses the same one. Each is checked
every SWEEP_EVERY_S: once its client closed the memfd (its connection was reset) or exited,
the server lets go of it.
"""

from __future__ import annotations

import hmac
import logging
import mmap
import os
import stat
import time
from dataclasses import dataclass, field

from shoal.wire.shared_area import AREA_BYTES, MEMFD_NAME, NONCE_BYTES, PAGE, fcntl

log = logging.getLogger(__name__)

MAX_AREAS = 64
SWEEP_EVERY_S = 2.0


@dataclass
class AttachedArea:
    """One client's area as this server maps it."""

    pid: int
    fd: int
    identity: tuple[int, int]  # (st_dev, st_ino) of the memfd: it is the same file while these match
    map: mmap.mmap = field(repr=False)
    released: bool = False
    peer: bytes | None = None  # the zmq routing id of the latest request through zmq that named it

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Bytes [offset, offset + nbytes) of the area. Raises ValueError outside it, or once the
        area was let go of (the client's header is not trusted)."""
        if self.released:
            raise ValueError("the shared area was let go of (its client reset or exited)")
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
        self.released = True
        try:
            self.map.close()
        except BufferError:  # a request's tensors still view it: the mapping goes with them
            log.debug("a shared area let go of is still viewed; it is unmapped with the last view")


class AttachedAreas:
    """The areas attached for this server's clients, by nonce.

    Not thread-safe: the serving thread's. `close` is idempotent.
    """

    def __init__(self, server_name: str = "server"):
        self._name = server_name
        self._areas: dict[bytes, AttachedArea] = {}
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S

    def __len__(self) -> int:
        return len(self._areas)

    def attach(self, offer) -> AttachedArea | None:
        """The area `offer` (a request header's OFFER_KEY field) names, attached now if it was
        not already; None if it cannot be (logged once per offer). Never raises for a bad offer."""
        area = self.find(offer.get("nonce")) if type(offer) is dict else None
        if area is not None and area.pid == offer.get("pid") and area.fd == offer.get("fd"):
            return area
        try:
            pid, fd, size, nonce = _fields(offer)
            if area is not None:
                raise ValueError("its nonce names another process's area")
            if len(self._areas) >= MAX_AREAS:
                self.sweep(force=True)
            if len(self._areas) >= MAX_AREAS:
                raise ValueError(f"{MAX_AREAS} areas are attached already")
            area = _attach(pid, fd, size, nonce)
        except (OSError, ValueError) as e:
            log.info("%s: a client's tensors go through the socket, not shared memory: %s", self._name, e)
            return None
        self._areas[nonce] = area
        log.info("%s: a client on this machine (pid %d) sends its tensors through shared memory", self._name, pid)
        return area

    def held_by(self, pid: int) -> bool:
        """Whether process `pid` holds an area attached here."""
        return any(area.pid == pid for area in self._areas.values())

    def find(self, nonce: bytes) -> AttachedArea | None:
        """The attached area whose nonce is `nonce`, if any."""
        return self._areas.get(nonce) if type(nonce) is bytes and len(nonce) == NONCE_BYTES else None

    def sweep(self, force: bool = False) -> None:
        """Let go of areas whose client closed them or exited; at most every SWEEP_EVERY_S
        unless `force`. Cheap when not due (one clock read)."""
        now = time.monotonic()
        if not force and now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for nonce, area in list(self._areas.items()):
            if not area.alive():
                area.release()
                del self._areas[nonce]

    def close(self) -> None:
        for area in self._areas.values():
            area.release()
        self._areas.clear()


def _fields(offer) -> tuple[int, int, int, bytes]:
    if type(offer) is not dict:
        raise ValueError(f"an offer must be a map, got {type(offer).__name__}")
    pid, fd, size, nonce = offer.get("pid"), offer.get("fd"), offer.get("size"), offer.get("nonce")
    if not (type(pid) is int and pid > 0 and type(fd) is int and fd >= 0 and size == AREA_BYTES
            and type(nonce) is bytes and len(nonce) == NONCE_BYTES):
        raise ValueError(f"bad offer fields pid={pid!r:.20} fd={fd!r:.20} size={size!r:.20} "
                         f"(areas are {AREA_BYTES} bytes)")
    return pid, fd, size, nonce


def _attach(pid: int, fd: int, size: int, nonce: bytes) -> AttachedArea:
    if fcntl is None:
        raise ValueError("this system has no shared areas")
    path = f"/proc/{pid}/fd/{fd}"
    if not os.readlink(path).startswith(f"/memfd:{MEMFD_NAME} "):  # (a cheap filter; checked again once open)
        raise ValueError(f"{path} is not a shared area")
    own = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not os.readlink(f"/proc/self/fd/{own}").startswith(f"/memfd:{MEMFD_NAME} "):
            raise ValueError(f"{path} is not a shared area")  # (swapped since the readlink above)
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
