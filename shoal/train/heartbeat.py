"""`Heartbeats`: a training replica tells every ps it is alive, from a thread of its own.

The ps tasks count a replica as a member while its heartbeats come (shoal/ps/membership.py):
its first makes it a member, and once none came for `timeout_s` it is dropped — a sync step
then completes without it. The heartbeats come from their own thread and connections, so a
long step (or a step that waits for its sync peers) does not make a replica look dead; a
process that is frozen (SIGSTOP) or gone stops them, which is the point.

A heartbeat that is not answered (a ps restarting, a slow network) is not an error: the next
one goes out on time. A ps that dropped this replica for its silence answers with a challenge,
which a heartbeat sent at once echoes to be counted again (held-back heartbeats of a process
that is gone cannot). A reply saying the replica joined again after the first means the ps
had dropped it (or restarted): logged as a warning, and the ps's address kept for
`take_rejoined` (the chief rebuilds a restarted ps that no push of its reaches:
shoal/train/idle_ps.py).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from typing import Sequence

from shoal.ps.membership import heartbeat_interval
from shoal.ps.protocol import HeartbeatReply, HeartbeatRequest, Op
from shoal.wire import JobSecret, PeerLostError, PeerTimeoutError, RpcClient, Security, WireError

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT_S = 20.0
"""A replica silent this long is dropped from the membership (its sync steps go on without it)."""


class Heartbeats:
    """Sends `task`'s heartbeats to every ps at `addresses` every `heartbeat_interval(timeout_s)`.

    `start()` returns at once (a daemon thread sends); `stop()` blocks until the thread ended
    (see there) and is idempotent; `start()` after `stop()` sends again. `incarnation` names this process's heartbeats,
    so a ps can tell them from those of a restarted process of the same task. Thread-safe.
    """

    def __init__(self, task: str, addresses: Sequence[str], secret: JobSecret, *, timeout_s: float,
                 security: Security = Security.AUTO) -> None:
        self.task = task
        self.addresses = tuple(addresses)
        self.timeout_s = timeout_s
        self.interval_s = heartbeat_interval(timeout_s)
        self.incarnation = secrets.token_hex(8)
        self._secret = secret
        self._security = security
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._versions: dict[str, int] = {}  # per ps address, the membership version of its last reply
        self._challenges: dict[str, str] = {}  # per ps address, its last reply's challenge (the sending thread's)
        self._lock = threading.Lock()  # guards `addresses` and `_dropped`, which the session's thread changes
        self._dropped: frozenset[str] = frozenset()
        self._rejoined: frozenset[str] = frozenset()  # addresses of the ps that counted this replica joining again
        self.live_members: int | None = None  # how many replicas ps 0 counts as training, last we heard

    def start(self) -> "Heartbeats":
        """Start sending; after `stop`, again, as a new incarnation (the ps may have been told
        the old one failed). Returns self."""
        if self._thread is not None and not self._stop.is_set():
            return self  # already sending
        if self._thread is not None:  # started before: a new incarnation
            self.incarnation = secrets.token_hex(8)
        self._stop = threading.Event()  # each thread its own: one still ending after stop() keeps its own
        self._thread = threading.Thread(target=self._run, args=(self._stop, self.incarnation),
                                        name=f"shoal-heartbeat-{self.task}", daemon=True)
        self._thread.start()
        return self

    def add(self, address: str) -> None:
        """Heartbeat one more ps (one that joined the running job) from the next beat on. Does not
        block; thread-safe."""
        with self._lock:
            self._dropped = self._dropped - {address}  # a ps that joined where a re-homed one served
            if address not in self.addresses:
                self.addresses = (*self.addresses, address)

    def drop(self, address: str) -> None:
        """Heartbeat the ps at `address` no more, from the next beat on: its shards were re-homed
        (shoal/train/rehoming.py), and a process started again there must not count this replica
        as training. Does not block; thread-safe."""
        with self._lock:
            self._dropped = self._dropped | {address}

    def take_rejoined(self) -> frozenset[str]:
        """The addresses of the ps tasks whose membership this replica joined again (the ps had
        dropped it, or restarted) since the last call; emptied. Does not block; thread-safe, and
        cheap when there are none (a read, no lock)."""
        if not self._rejoined:
            return frozenset()
        with self._lock:
            rejoined, self._rejoined = self._rejoined, frozenset()
        return rejoined

    def stop(self) -> None:
        """Stop sending. Waits up to 1 s for the thread (it waits between heartbeats, so it
        ends at once unless a ps is not answering; then it ends by itself within an interval)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self, stop: threading.Event, incarnation: str) -> None:
        clients = [RpcClient(address, self._secret, f"ps:{i}", self.interval_s, security=self._security)
                   for i, address in enumerate(self.addresses)]
        request = HeartbeatRequest(self.task, incarnation, max(1, round(self.timeout_s * 1000)))
        try:
            while not stop.is_set():
                with self._lock:
                    added, dropped = self.addresses[len(clients):], self._dropped
                for address in dropped:  # a ps joining there later is a new member, not a rejoin
                    self._versions.pop(address, None)
                clients += [RpcClient(address, self._secret, f"ps:{len(clients) + i}", self.interval_s,
                                      security=self._security) for i, address in enumerate(added)]
                started = time.monotonic()
                self._beat([c for c in clients if c.address not in dropped], request, started + self.interval_s)
                stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            for client in clients:
                client.close()

    def _beat(self, clients: list[RpcClient], request: HeartbeatRequest, deadline: float) -> None:
        """One heartbeat to each of `clients`, waiting for their replies until `deadline`; then,
        at once, one more to each ps whose reply challenged this replica (it had dropped it), so
        it counts this replica again now, not an interval later."""
        challenged = self._send_and_read(clients, request, deadline)
        if challenged:
            self._send_and_read(challenged, request, deadline)

    def _send_and_read(self, clients: list[RpcClient], request: HeartbeatRequest, deadline: float) -> list[RpcClient]:
        """Send and read one heartbeat per client; returns those whose reply carried a challenge
        this heartbeat did not answer."""
        challenged = []
        sent = []
        for client in clients:
            answer = self._challenges.get(client.address, "")
            fields = dataclasses.replace(request, answer=answer).fields() if answer else request.fields()
            try:
                sent.append((client, client.send(Op.HEARTBEAT.value, fields)))
            except WireError as e:
                log.debug("%s: heartbeat to %s not sent: %s", self.task, client.peer_name, e)
        for client, rid in sent:
            try:
                reply = HeartbeatReply.decode(client.wait(rid, max(0.01, deadline - time.monotonic())).header)
            except (PeerTimeoutError, PeerLostError) as e:
                log.debug("%s: heartbeat to %s unanswered: %s", self.task, client.peer_name, e)
                continue
            except WireError as e:
                log.debug("%s: heartbeat to %s refused: %s", self.task, client.peer_name, e)
                continue
            if reply.joined and client.address in self._versions:
                log.warning("%s rejoined %s's membership (v%d, %d training): it had been dropped after %gs "
                            "without a heartbeat, or the ps restarted", self.task, client.peer_name, reply.version,
                            reply.members, self.timeout_s)
                with self._lock:
                    self._rejoined = self._rejoined | {client.address}
            self._versions[client.address] = reply.version
            if reply.challenge and reply.challenge != self._challenges.get(client.address):
                challenged.append(client)
            self._challenges[client.address] = reply.challenge  # answered by the next heartbeat (at once, if new)
            if client.address == self.addresses[0]:  # ps 0, never re-homed
                self.live_members = reply.members
        return challenged
