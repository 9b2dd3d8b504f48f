"""RpcClient: one authenticated DEALER connection to a server, with a timeout on every request."""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from shoal.wire.doorbell import BELL_KEY, BELL_MAX_BYTES, BellState, Doorbell, Sent, valid_name
from shoal.wire.endpoint import connect_endpoint, is_ipv6, is_on_this_host
from shoal.wire.errors import AuthRejectedError, PeerLostError, PeerTimeoutError, ProtocolError, RemoteError
from shoal.wire.limits import ConnectionLimits
from shoal.wire.mechanisms import Mechanism, mechanism_for
from shoal.wire.memory import keep_freed_memory
from shoal.wire.message import Message, decode, encode
from shoal.wire.secret import JobSecret
from shoal.wire.security import Security
from shoal.wire.shared_area import (ACK_KEY, MIN_SHARED_BYTES, OFFER_KEY, AreaState, SharedArea, packed_nbytes,
                                    supported)
from shoal.wire.sockio import NOBLOCK, recv_message, send_message
from shoal.wire.watch import EVENTS, ConnectionWatch

log = logging.getLogger(__name__)

_rids = itertools.count(1)

# A wait blocks on a socket this long at most before it reads the connection's monitor events
# (a refusal, a lost connection), checks its deadline and reports progress.
WATCH_EVERY_MS = 50

MAX_DROPPED = 64
"""How many requests dropped by a reset a client remembers, for a late wait on one (see `reset`)."""

# zmq pings the peer every HEARTBEAT_IVL and drops the connection if nothing comes back within
# HEARTBEAT_TIMEOUT, so a peer whose machine vanished (no FIN, no RST) is noticed as lost.
HEARTBEAT_IVL_MS = 2000
HEARTBEAT_TIMEOUT_MS = 10000

# Plain ints: `int & zmq.POLLIN` goes through PollEvent's Python-level __rand__, once per request.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class RpcClient:
    """Sends requests to one server and waits for their replies.

    `security` picks how the connection authenticates (shoal/wire/security.py): by default
    PLAIN to a loopback address, CURVE (encrypted) otherwise; the server must resolve the same.

    With `shared_memory` (the default), a client of a server on this host (a loopback address or
    one of this host's own, `is_on_this_host`) sends the tensors of its big requests through a
    shared-memory area once the server has attached it (shoal/wire/shared_area.py), and through
    the socket until then or if it does not. From then on its requests that are a header alone
    go on a doorbell line to the server that skips zmq (shoal/wire/doorbell.py); requests that
    are out together may then be handled in any order.

    Not thread-safe: use one client per thread. Several clients can be awaited together
    with `wait_all`, which is how a worker talks to every parameter server at once.
    """

    def __init__(self, address: str, secret: JobSecret, peer_name: str, timeout_s: float = 30.0, *,
                 security: Security = Security.AUTO, limits: ConnectionLimits = ConnectionLimits(),
                 shared_memory: bool = True):
        self.address = address
        self.peer_name = peer_name
        self.timeout_s = timeout_s
        self.limits = limits
        self._requested_security = security
        self._secret = secret
        self._mechanism: Mechanism | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._watch: ConnectionWatch | None = None
        self._wait_ms = 0  # the socket's RCVTIMEO: how long a blocking receive waits
        self._pending: dict[int, str] = {}
        self._replies: dict[int, Message] = {}
        self._into: dict[int, Any] = {}
        # requests dropped by a reset while someone may still wait for them (another request's
        # failure reset the connection): a wait for one raises PeerLostError at once
        self._dropped: dict[int, str] = {}
        self._area = SharedArea() if shared_memory and supported() else None  # if the server is here: first use
        self._offered: set[int] = set()  # requests sent while the area waited for the server's answer
        self._bell: Doorbell | None = None  # the line to the server, once it named one
        self._bell_poller: zmq.Poller | None = None  # the zmq socket and the line, waited on together
        self._by_bell: set[int] = set()  # requests out on the line
        self._by_zmq: set[int] = set()  # requests out through zmq (while any is, requests keep to zmq)
        self._rung: set[str] = set()  # doorbells rung on this connection (one that hung up is not rung again)
        # The connection broke just before a request went (read by `_ring`, not by a wait): lost, as
        # if the request had been out, unless it is back by the time a wait reads the monitor.
        self._drop_unseen = False

    @property
    def shared_state(self) -> AreaState | None:
        """Where the shared-memory area stands; None if this client never uses one (its server
        is on another host, known once it sent a request with tensors, or it may not)."""
        return self._area.state if self._area is not None else None

    @property
    def bell_state(self) -> BellState | None:
        """Where the doorbell line to the server stands (shoal/wire/doorbell.py); None without one."""
        return self._bell.state if self._bell is not None else None

    @property
    def security(self) -> Security:
        """The mechanism this client uses: PLAIN or CURVE."""
        return self._requested_security.resolve(self.address)

    def connect(self) -> None:
        """Open the connection (zmq connects in the background; requests queue until it is up)."""
        keep_freed_memory()
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        self.limits.apply(sock)  # a server that is not ours must not flood us either
        if self._mechanism is None:
            self._mechanism = mechanism_for(self._requested_security, self.address, self._secret)
        self._mechanism.configure_client(sock)
        # An id of our own, kept when zmq connects again (the server hands it over): a reply the
        # server sends through zmq to a request that came on the doorbell line finds us then too.
        sock.setsockopt(zmq.ROUTING_ID, b"s" + os.urandom(15))
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if is_ipv6(self.address):
            sock.setsockopt(zmq.IPV6, 1)
        self._monitor = sock.get_monitor_socket(EVENTS)
        self._watch = ConnectionWatch(self.peer_name, self.address, self._mechanism.security)
        sock.connect(connect_endpoint(self.address))
        self._sock = sock
        self._wait_ms = 0

    def send(self, op: str, fields: dict[str, Any] | None = None,
             tensors: Mapping[str, np.ndarray] | None = None,
             into: Mapping[str, np.ndarray] | None = None) -> int:
        """Queue a request; returns its id for `wait`. Blocks only while zmq has no room to queue
        it, up to the client's timeout (see `_queue`), and at the first request with tensors,
        which decides whether the server is on this host (a name lookup, for a server named by a
        host name).

        `into` maps reply tensor names to arrays the reply's bytes are written into directly
        (when dtype and shape match); nothing is written once the request was given up on."""
        if self._sock is None:
            self.connect()
        rid = next(_rids)
        header = dict(fields or {}, op=op, rid=rid)
        block = self._shared_block(rid, header, tensors) if tensors and self._area is not None else None
        try:
            frames = encode(header, tensors, block)
            if not self._ring(rid, frames):
                if self._by_bell and OFFER_KEY not in header:  # the server takes what is on the line first
                    header[OFFER_KEY] = self._area.offer()
                    frames = encode(header, tensors, block)
                if not self._pending:
                    self._judge_the_connection_first()
                self._queue(frames, op)
                self._by_zmq.add(rid)
        except BaseException:
            if self._area is not None:  # nothing went out: the block and the offer are void
                self._area.free(rid)
                self._offered.discard(rid)
            raise
        self._pending[rid] = op
        if into is not None:
            self._into[rid] = into
        return rid

    def _ring(self, rid: int, frames: list) -> bool:
        """Send a request on the doorbell line if it can go there: the line is up and has room,
        the request is a header alone of at most BELL_MAX_BYTES, and no request waits for a
        reply through zmq, whose connection is up (the monitor says so). Returns whether it went.
        Does not block.

        A request that goes through zmq while requests are out on the line names the area
        (`OFFER_KEY`, see `send`): the server handles what waits on the line before it."""
        bell = self._bell
        if (bell is None or bell.state is not BellState.UP or len(frames) != 1 or len(frames[0]) > BELL_MAX_BYTES
                or self._by_zmq):
            return False
        if not self._judge_the_connection_first():  # (which may read the end of the line too)
            return False  # a reply through zmq would find no connection: the request queues on zmq
        if self._bell is not bell:
            return False
        sent = bell.send(frames[0])
        if sent is Sent.GONE:
            self._hang_up(read_first=True)
        if sent is not Sent.SENT:
            return False
        self._by_bell.add(rid)
        return True

    def _judge_the_connection_first(self) -> bool:
        """Before a request goes (on the doorbell line, or to zmq with none out): read the
        monitor, and return whether the connection is up. So a connection that broke while
        nothing was out (a server restarted between two requests) is not taken, once a wait
        reads its event, for the loss of this request when a new one is up. If this read saw it
        break and none is up (the server is gone, or not back yet), the request counts as lost
        unless the connection is back by the time a wait reads the monitor, as one out when it
        broke would. A break read earlier, while no request was out, leaves the request to zmq,
        which sends it once it connects again. Does not block."""
        watch = self._watch
        if watch is None:
            return False
        dropped = watch.dropped
        self._read_monitor()
        if watch.dropped > dropped and not watch.up:
            self._drop_unseen = True
        return watch.up

    def _queue(self, frames: list, op: str) -> None:
        """Hand a request's frames to zmq. While zmq has no room for them (no connection to queue
        them on: one whose handshake the server refused can leave none; or SNDHWM requests
        already waiting), block up to the client's timeout, reading the monitor every
        WATCH_EVERY_MS: AuthRejectedError once it says the server refused us, PeerTimeoutError
        if no room came in time (the client is reset either way)."""
        deadline = None
        while True:
            try:
                send_message(self._sock, frames, copied=1, flags=NOBLOCK)
                return
            except zmq.Again:
                deadline = deadline or time.monotonic() + self.timeout_s
            self._read_monitor()
            refusal = self._watch.refusal if self._watch is not None else None
            remaining = deadline - time.monotonic()
            if refusal is not None or remaining <= 0:
                waiting = self._sock.getsockopt(zmq.SNDHWM)
                self.reset()
                if refusal is not None:
                    raise AuthRejectedError(refusal)
                raise PeerTimeoutError(
                    f"{self.peer_name} at {self.address} took no request for {self.timeout_s:.1f}s: zmq had no room "
                    f"to queue {op!r} (no connection up, or {waiting} requests already waiting); check that the task "
                    "is running and reachable, or raise the request timeout")
            self._sock.poll(min(WATCH_EVERY_MS, max(1, int(remaining * 1000))), zmq.POLLOUT)

    def _shared_block(self, rid: int, header: dict, tensors: Mapping[str, np.ndarray]) -> tuple | None:
        """The block of the shared area that carries request `rid`'s tensors, if the server
        attached the area, it has room, and they are MIN_SHARED_BYTES or more or the doorbell
        line is up. Names the area in `header` (the server attaches it on first sight, and again
        after zmq made the connection anew)."""
        area = self._area
        if area.state is AreaState.REFUSED:
            return None
        if area.state is AreaState.NONE:
            if not is_on_this_host(self.address):  # decided once, here: it may look the name up
                self._area = None
                return None
            try:
                area.open()
            except OSError as e:
                log.debug("no shared-memory area for %s: %s", self.peer_name, e)
                self._area = None
                return None
        header[OFFER_KEY] = area.offer()
        if area.state is AreaState.OFFERED:
            self._offered.add(rid)
            return None
        nbytes = packed_nbytes(tensors)
        if nbytes < MIN_SHARED_BYTES and self._bell is None:
            return None  # (once the doorbell is up small ones go in the area too: the request is a header alone)
        block = area.allocate(rid, nbytes)
        return (block.offset, area.view(block.offset, block.nbytes)) if block is not None else None

    def wait(self, rid: int, timeout_s: float | None = None) -> Message:
        """Block until the reply to `rid` arrives. Raises PeerTimeoutError, AuthRejectedError
        or RemoteError (the server's own error message)."""
        return wait_all([(self, rid)], timeout_s if timeout_s is not None else self.timeout_s)[0]

    def call(self, op: str, fields: dict[str, Any] | None = None,
             tensors: Mapping[str, np.ndarray] | None = None, timeout_s: float | None = None) -> Message:
        """send + wait. Blocks up to the timeout."""
        return self.wait(self.send(op, fields, tensors), timeout_s)

    def _read_monitor(self) -> None:
        """Take the monitor's events (connection up, lost, refused). Does not block. Asks the
        socket whether an event waits before reading one: a read that finds none costs a raised
        zmq.Again, about twice the question, and most reads (one per request sent) find none."""
        while self._monitor is not None and self._monitor.get(_EVENTS) & _POLLIN:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            self._watch.on_event(event["event"], event["value"], bool(self._pending))
        if self._drop_unseen and self._watch is not None and self._pending:
            self._drop_unseen = False
            self._watch.lost = self._watch.lost or not self._watch.up
        if self._watch is not None and (self._watch.lost or self._watch.refusal is not None):
            while self._read_reply():  # the replies that came before the connection went count
                pass

    def _read_reply(self, wait_ms: int = 0) -> bool:
        """Take one reply, keeping it if someone waits for it; returns whether one came.
        Blocks up to `wait_ms` for it (0: only a reply already queued)."""
        frames = self._receive(wait_ms) if self._bell is None else self._receive_either(wait_ms)
        if frames is None:
            return False
        self._accept(frames)
        return True

    def _accept(self, frames: list) -> None:
        """Decode one reply and keep it if someone waits for it."""
        area = self._area
        try:
            shared = area.view if area is not None and area.state is AreaState.ATTACHED else None
            message = decode(frames, self._destination, shared)
        except ProtocolError as e:
            log.warning("ignored a malformed reply from %s at %s: %s", self.peer_name, self.address, e)
            return
        if area is not None:  # the reply's block (copied out above) is free again
            if message.rid in self._offered:
                area.answered(message.header.get(ACK_KEY))  # no answer to an offering request: an older server
                self._offered.discard(message.rid)
            elif message.header.get(ACK_KEY) is False and area.state is AreaState.ATTACHED:
                area.refused()  # (a server started again on the address that cannot attach it)
                self._hang_up()
            area.free(message.rid)
            if self._bell is None and area.state is AreaState.ATTACHED and BELL_KEY in message.header:
                self._ring_up(message.header[BELL_KEY])
        self._by_bell.discard(message.rid)
        self._by_zmq.discard(message.rid)
        if message.rid in self._pending:
            self._replies[message.rid] = message

    def _receive(self, wait_ms: int) -> list | None:
        """The frames of the next message from zmq, waiting up to `wait_ms`; None if none came."""
        try:
            if wait_ms:
                if wait_ms != self._wait_ms:  # (an option of zmq's, no system call)
                    self._sock.setsockopt(zmq.RCVTIMEO, wait_ms)
                    self._wait_ms = wait_ms
                return recv_message(self._sock)
            return recv_message(self._sock, NOBLOCK)
        except zmq.Again:
            return None

    def _receive_either(self, wait_ms: int) -> list | None:
        """The next message from zmq or the doorbell line, waiting up to `wait_ms` for either;
        None if none came in that time. The server's answer to the hello and the end of the line
        are taken care of here, and the wait goes on after them (a caller that reads the monitor
        when a wait comes back empty must not do so early). A line that ends leaves the client
        on zmq alone."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            ready = dict(self._bell_poller.poll(wait_ms))
            bell = self._bell
            if bell.fileno() in ready:
                message = bell.receive()
                if message is not None:
                    return [message]
                if bell.state is BellState.GONE:
                    self._hang_up()
            if self._sock in ready:
                return self._receive(0)
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if not ready or wait_ms <= 0:
                return None
            if self._bell is None:
                return self._receive(wait_ms)

    def _ring_up(self, name) -> None:
        """Connect to the doorbell a reply named, unless this connection rang it before."""
        if not valid_name(name) or name in self._rung:
            return
        self._rung.add(name)
        bell = Doorbell(name)
        if bell.ring(self._area.offer()["nonce"]):
            self._bell = bell
            self._bell_poller = zmq.Poller()
            self._bell_poller.register(self._sock, zmq.POLLIN)
            self._bell_poller.register(bell.fileno(), zmq.POLLIN)

    def _hang_up(self, read_first: bool = False) -> None:
        """Drop the doorbell line: the next requests go through zmq. With `read_first`, the
        replies still on the line are taken first. The replies to requests still out on it come
        through zmq or not at all; if the server went, zmq says so (lost)."""
        bell, self._bell, self._bell_poller = self._bell, None, None  # (a reply read here may hang up too)
        if bell is not None:
            while read_first and (message := bell.receive()) is not None:
                self._accept([message])
            bell.close()
        self._by_bell.clear()

    def _destination(self, header: dict, name: str, dtype, shape) -> np.ndarray | None:
        into = self._into.get(header["rid"]) if header.get("ok") and header["rid"] in self._pending else None
        return into.get(name) if into is not None else None

    def _check_watch(self, rid: int, timeout_s: float) -> None:
        """Raise (and reset) if the monitor said the server refused us or the connection went."""
        op = self._dropped.pop(rid, None)
        if op is not None:
            raise PeerLostError(f"lost the connection to {self.peer_name} at {self.address} while it handled "
                                f"{op!r}: it was reset when another request failed", self.peer_name)
        watch = self._watch
        if watch is not None and (watch.refusal is not None or watch.lost):
            self._fail(rid, timeout_s)

    def _has(self, rid: int) -> bool:
        return rid in self._replies

    def _take(self, rid: int) -> Message:
        message = self._replies.pop(rid)
        op = self._pending.pop(rid)
        self._into.pop(rid, None)
        if not message.header.get("ok"):
            error = message.header.get("error")
            raise RemoteError(f"{self.peer_name} at {self.address} refused {op!r}: "
                              f"{error if isinstance(error, str) else 'no reason given'}", self.peer_name)
        return message

    def _fail(self, rid: int, timeout_s: float) -> None:
        op = self._pending.get(rid, "?")
        refusal = self._watch.refusal if self._watch is not None else None
        lost = self._watch is not None and self._watch.lost
        self.reset()
        self._dropped.pop(rid, None)  # (raised for right here)
        if lost and refusal is None:
            raise PeerLostError(f"lost the connection to {self.peer_name} at {self.address} while it handled "
                                f"{op!r} (did the task die?)", self.peer_name)
        if refusal is not None:
            raise AuthRejectedError(refusal)
        raise PeerTimeoutError(
            f"{self.peer_name} at {self.address} did not answer {op!r} within {timeout_s:.1f}s; check that the "
            "task is running and reachable, or raise the request timeout")

    def reset(self) -> None:
        """Drop the connection and anything queued on it (a late reply or a queued request
        must never be delivered after we gave up on it). The next send reconnects. A wait
        for a request that was out raises PeerLostError (the last MAX_DROPPED are remembered)."""
        self.close()
        self._dropped.update(self._pending)
        for rid in list(self._dropped)[:-MAX_DROPPED]:
            del self._dropped[rid]
        self._pending.clear()
        self._replies.clear()
        self._into.clear()

    def close(self) -> None:
        """Close the connection (and the shared area and doorbell line: a new connection offers a
        new area and rings again). Idempotent."""
        self._hang_up()
        self._rung.clear()
        self._by_zmq.clear()
        self._drop_unseen = False
        if self._area is not None:
            self._area.close()
            self._offered.clear()
        if self._sock is not None:
            self._sock.disable_monitor()
            self._sock.close(linger=0)
            self._sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
        self._watch = None


Progress = Callable[[float, Sequence[str]], None]
"""progress(seconds waited, peer names still missing), called while a wait_all is slow."""


def wait_all(pending: Sequence[tuple[RpcClient, int]], timeout_s: float, *,
             progress: Progress | None = None, progress_every_s: float = 5.0) -> list[Message]:
    """Block until every (client, rid) has its reply, or raise for the first that cannot.

    Auth refusal and a lost connection (PeerLostError) are reported within WATCH_EVERY_MS of
    being seen, a silent peer after `timeout_s`, a server's refusal (RemoteError) once every
    reply is in. Only the failing client is reset, and only the refused reply is taken: the
    replies to the other requests stay buffered, so the caller can wait for them again. Every
    `progress_every_s` of waiting, `progress(waited, peers still missing)` is called (it must
    not use these clients; its own time counts against `timeout_s`).

    The replies are taken in the order of `pending`, each with a blocking receive on its
    client's socket that gives up every WATCH_EVERY_MS to read the monitors: a poll of the
    sockets and their monitors, then a receive, made more system calls per request than the
    reply itself (bench/README.md, "The tiny request"). Replies to the others queue meanwhile.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    next_progress = started + progress_every_s
    for client, _ in pending:
        if client._sock is None:
            client.connect()
    for client, rid in pending:
        while not client._has(rid):
            client._check_watch(rid, timeout_s)
            now = time.monotonic()
            if now >= deadline:
                client._fail(rid, timeout_s)
            if progress is not None and now >= next_progress:
                progress(now - started, sorted({c.peer_name for c, r in pending if not c._has(r)}))
                next_progress = time.monotonic() + progress_every_s
                continue
            if not client._read_reply(wait_ms=min(WATCH_EVERY_MS, max(1, int((deadline - now) * 1000)))):
                for c, r in pending:  # a slice passed with no reply: what do the monitors say?
                    if not c._has(r):
                        c._read_monitor()
                        c._check_watch(r, timeout_s)
    for client, rid in pending:  # a refusal is raised before any reply is taken: the others stay for the next wait
        if not client._replies[rid].header.get("ok"):
            client._take(rid)
    return [client._take(rid) for client, rid in pending]
