"""Which of a server's connections have not authenticated yet, and which of them to drop.

Pure bookkeeping, fed by the Gatekeeper (shoal/wire/gatekeeper.py) from zmq's socket monitor and
ZAP requests; no sockets, no clock of its own. zmq tells us when it accepted a connection (with
its fd) and when one closed, but not which connection finished its handshake. So a connection
counts as unauthenticated until one of:

- a message arrived from its fd (`trusted`): messages only flow after the handshake;
- it is older than the handshake timeout: zmq drops any handshake that takes longer, so a
  connection still open by then has authenticated;

and each approval our ZAP handler gave an address (`approved`) offsets one of that address's
unconfirmed connections until a message from it arrives. Over a bound, the oldest unconfirmed
connection of the address goes first: a peer that greeted and went silent is older than a worker
that connected a moment ago and is still in its handshake.
"""

from __future__ import annotations

import enum
from collections import defaultdict, deque
from dataclasses import dataclass


class ConnState(enum.Enum):
    """Where an accepted connection stands. HANDSHAKING -> TRUSTED | EVICTED -> CLOSED;
    HANDSHAKING -> CLOSED (zmq dropped it: wrong secret, timeout, peer left)."""

    HANDSHAKING = "handshaking"  # not known to have authenticated
    TRUSTED = "trusted"          # authenticated (sent a message, or outlived the handshake timeout)
    EVICTED = "evicted"          # we shut it down; zmq has not reported it closed yet
    CLOSED = "closed"            # gone


@dataclass(eq=False)
class Connection:
    """One accepted TCP connection, as the socket monitor reported it."""

    fd: int
    host: str
    port: int
    accepted_at: float
    state: ConnState = ConnState.HANDSHAKING


class HandshakeLedger:
    """Counts unauthenticated connections per peer address and picks the ones to drop.

    `per_address`: most unauthenticated connections one address may hold; `total`: most of all
    addresses together; `handshake_s`: the handshake timeout zmq enforces. Times are whatever
    monotonic clock the caller passes. Not thread-safe: the caller serializes the calls.
    """

    def __init__(self, per_address: int, total: int, handshake_s: float):
        self.per_address = per_address
        self.total = total
        self.handshake_s = handshake_s
        self._by_fd: dict[int, Connection] = {}
        self._order: deque[Connection] = deque()  # every connection, in the order it was accepted
        self._by_host: dict[str, deque[Connection]] = defaultdict(deque)  # same, per address
        self._handshaking: dict[str, int] = defaultdict(int)
        self._approvals: dict[str, deque[float]] = defaultdict(deque)

    def accepted(self, fd: int, host: str, port: int, now: float) -> list[Connection]:
        """Record a new connection; returns the connections to shut down now (already marked
        EVICTED), oldest first."""
        self.closed(fd)  # a close we were not told about: the fd was reused
        conn = Connection(fd, host, port, now)
        self._by_fd[fd] = conn
        self._order.append(conn)
        mine = self._by_host[host]
        while mine and mine[0].state is not ConnState.HANDSHAKING:
            mine.popleft()  # keep the deque as short as what still counts
        mine.append(conn)
        self._handshaking[host] += 1
        self._expire(now)
        victims = []
        while self._unauthenticated(host) > self.per_address:
            victims.append(self._evict(self._oldest(self._by_host[host])))
        while self.unauthenticated(now) > self.total:
            victims.append(self._evict(self._oldest(self._order, over_credit=True)))
        return victims

    def approved(self, host: str, now: float) -> None:
        """Our ZAP handler let a connection from `host` in (we do not know which one)."""
        self._approvals[host].append(now)

    def trusted(self, fd: int) -> None:
        """A message arrived from `fd`: its connection has authenticated."""
        conn = self._by_fd.get(fd)
        if conn is not None and conn.state is ConnState.HANDSHAKING:
            self._leave_handshake(conn, ConnState.TRUSTED)
            approvals = self._approvals.get(conn.host)
            if approvals:
                approvals.popleft()  # that approval was this connection's

    def closed(self, fd: int) -> None:
        """zmq closed the connection on `fd` (or it was never known). Idempotent."""
        conn = self._by_fd.pop(fd, None)
        if conn is None:
            return
        if conn.state is ConnState.HANDSHAKING:
            self._leave_handshake(conn, ConnState.CLOSED)
        conn.state = ConnState.CLOSED

    def unauthenticated(self, now: float, host: str | None = None) -> int:
        """Connections not known to have authenticated, of `host` or of every address."""
        self._expire(now)
        if host is not None:
            return self._unauthenticated(host)
        return sum(self._unauthenticated(h) for h in self._handshaking)

    def __len__(self) -> int:
        return len(self._by_fd)

    def _unauthenticated(self, host: str) -> int:
        return max(0, self._handshaking.get(host, 0) - len(self._approvals.get(host, ())))

    def _expire(self, now: float) -> None:
        """Connections older than the handshake timeout authenticated; so did old approvals' ones."""
        cutoff = now - self.handshake_s
        while self._order and (self._order[0].state is not ConnState.HANDSHAKING
                               or self._order[0].accepted_at <= cutoff):
            conn = self._order.popleft()
            if conn.state is ConnState.HANDSHAKING:
                self._leave_handshake(conn, ConnState.TRUSTED)
        for host in [h for h, times in self._approvals.items() if times and times[0] <= cutoff]:
            times = self._approvals[host]
            while times and times[0] <= cutoff:
                times.popleft()
        for host in [h for h, n in self._handshaking.items() if n == 0]:
            del self._handshaking[host]
            self._by_host.pop(host, None)
            if not self._approvals.get(host):
                self._approvals.pop(host, None)

    def _oldest(self, queue: deque[Connection], over_credit: bool = False) -> Connection:
        """The oldest HANDSHAKING connection in `queue` (of an address over its approvals, with
        `over_credit`), dropping stale entries from the front as it goes."""
        while queue and queue[0].state is not ConnState.HANDSHAKING:
            queue.popleft()
        for conn in queue:
            if conn.state is ConnState.HANDSHAKING and (not over_credit or self._unauthenticated(conn.host) > 0):
                return conn
        raise AssertionError("no unauthenticated connection to evict")  # callers checked a count > 0

    def _evict(self, conn: Connection) -> Connection:
        self._leave_handshake(conn, ConnState.EVICTED)
        return conn

    def _leave_handshake(self, conn: Connection, state: ConnState) -> None:
        conn.state = state
        self._handshaking[conn.host] -= 1
