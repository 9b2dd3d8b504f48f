"""Gatekeeper: authenticates a server's peers (zmq's ZAP) and bounds those that have not.

One thread per server answers zmq's ZAP requests with `check` and reads the server socket's
monitor. Refused peers and dropped connections are logged at WARNING with the peer's address
and why, rate-limited (shoal/wire/refusals.py). For every accepted connection it asks the kernel who the peer is; when an address holds
more unauthenticated connections than `ConnectionLimits.unauthenticated_per_address` (or all
addresses together more than `unauthenticated_total`), it shuts the oldest of them down, so
peers without the job secret cannot use up the server's file descriptors or memory
(issue 10, W7). Which connections count as unauthenticated is the ledger's business
(shoal/wire/ledger.py).

zmq owns the connections' fds: the gatekeeper never closes one. It duplicates the fd into a
slot of its own (dup2, so it needs no free descriptor when the process is at its limit), checks
that it is still the same peer, and calls shutdown(); zmq then sees the connection end and
closes it as usual.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
import socket
import threading
import time
from typing import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from shoal.wire.ledger import Connection, HandshakeLedger
from shoal.wire.limits import ConnectionLimits
from shoal.wire.refusals import RefusalLog

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec (rfc.zeromq.org/spec/27)
ZAP_DOMAIN = b"shoal"
_ids = itertools.count()

# check(mechanism, credentials) -> whether to let the peer in. Credentials as ZAP gives them:
# [username, password] for PLAIN, [client public key (32 bytes)] for CURVE.
Check = Callable[[bytes, list[bytes]], bool]


class Gatekeeper:
    """Authenticates and bounds the peers of one server socket, on a thread of its own.

    Lifecycle: `start(sock)` before the socket binds (zmq lets every peer in when no ZAP
    handler is there), `trusted(fd)` from the serving thread for each message received,
    `close()` after the socket closed and before its context terminates.
    `trusted` and `close` are thread-safe; `start` must be called once.
    """

    def __init__(self, ctx: zmq.Context, limits: ConnectionLimits, check: Check, name: str = "server"):
        self.name = name
        self._ctx = ctx
        self._check = check
        self._ledger = HandshakeLedger(limits.unauthenticated_per_address, limits.unauthenticated_total,
                                       limits.handshake_timeout_s)
        self._refusals = RefusalLog(log, name)  # gatekeeper thread only
        self._over_bound = (f"too many connections that did not authenticate (bound: "
                            f"{limits.unauthenticated_per_address} per address, {limits.unauthenticated_total} in all)")
        self._lock = threading.Lock()  # guards the ledger (the serving thread calls `trusted`)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._zap: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._slot = -1   # an fd of ours that connection fds are dup2'ed onto
        self._null = -1   # what the slot points to between uses
        self.evicted = 0  # connections shut down so far (read it for logs and tests)

    def start(self, sock: zmq.Socket) -> None:
        """Bind the ZAP handler, watch `sock`'s connections, start the thread. Does not block."""
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        endpoint = f"inproc://shoal.gatekeeper.{os.getpid()}.{next(_ids)}"
        sock.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._monitor = self._ctx.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        # zmq's I/O thread blocks when a monitor queue is full; an unbounded queue, drained
        # here continuously, keeps a burst of connections from stalling it.
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(endpoint)
        self._null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._slot = os.dup(self._null)
        os.set_inheritable(self._slot, False)
        self._thread = threading.Thread(target=self._run, name=f"shoal-gatekeeper-{self.name}", daemon=True)
        self._thread.start()

    def trusted(self, fd: int) -> None:
        """A message arrived from the connection on `fd`, so it has authenticated. Thread-safe."""
        with self._lock:
            self._ledger.trusted(fd)

    def close(self) -> None:
        """Stop the thread and release its sockets and fds. Idempotent; blocks up to ~0.2 s."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None
        for sock in (self._zap, self._monitor):
            if sock is not None and not sock.closed:
                sock.close(linger=0)  # the thread closes them; this covers a start that failed midway
        self._zap = self._monitor = None
        for fd in (self._slot, self._null):
            if fd >= 0:
                os.close(fd)
        self._slot = self._null = -1

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                # ZAP first: a connection's ZAP request comes after its ACCEPTED event, and an
                # approval keeps it from counting against its address.
                if self._zap in ready:
                    self._answer_zap()
                if self._monitor in ready:
                    try:
                        self._drain_monitor()
                    except Exception:  # a bug in the bounds must not stop authentication (below)
                        log.exception("%s: the gatekeeper failed to process connection events", self.name)
        except zmq.ContextTerminated:
            pass
        finally:
            # Without a ZAP handler, libzmq 4.3 lets any CURVE client in (PLAIN ones are
            # refused), so this thread ends only when the server closes.
            self._zap.close(linger=0)
            self._monitor.close(linger=0)

    def _answer_zap(self) -> None:
        while True:
            try:
                frames = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # ZAP request: version, request id, domain, address, routing id, mechanism, credentials...
            try:
                ok = (len(frames) >= 6 and frames[0] == b"1.0" and frames[2] == ZAP_DOMAIN
                      and self._check(frames[5], frames[6:]))
            except Exception:  # REP must answer every request: a failed check is a refusal
                log.exception("%s: checking a peer's credentials failed; refusing it", self.name)
                ok = False
            request_id = frames[1] if len(frames) > 1 else b""
            self._zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                      b"OK" if ok else b"not this job's credentials", b"shoal" if ok else b"", b""])
            host = _host(frames[3].decode("ascii", "replace")) if len(frames) > 3 else "?"
            if ok:
                with self._lock:
                    self._ledger.approved(host, time.monotonic())
            else:
                self._refusals.refused(host, "not this job's credentials (another job secret, or another "
                                       "security setting: PLAIN vs CURVE)", time.monotonic())

    def _drain_monitor(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_DISCONNECTED:
                with self._lock:
                    self._ledger.closed(fd)
            elif event["event"] == zmq.EVENT_ACCEPTED:
                peer = self._peer(fd)
                if peer is None:
                    continue  # already gone (its DISCONNECTED event follows)
                with self._lock:
                    victims = self._ledger.accepted(fd, peer[0], peer[1], time.monotonic())
                for victim in victims:
                    self._shut_down(victim)

    def _peer(self, fd: int) -> tuple[str, int] | None:
        """(address, port) of the TCP peer on zmq's `fd`, or None if it is not one any more."""
        try:
            os.dup2(fd, self._slot, inheritable=False)
        except OSError:
            return None
        sock = None
        try:
            sock = socket.socket(fileno=self._slot)
            host, port = sock.getpeername()[:2]
            return _host(host), port
        except (OSError, ValueError, TypeError):
            return None  # not a TCP socket any more
        finally:
            if sock is not None:
                sock.detach()
            os.dup2(self._null, self._slot, inheritable=False)

    def _shut_down(self, conn: Connection) -> None:
        """Shut `conn` down if its fd still holds the same peer (zmq may have reused the fd)."""
        try:
            os.dup2(conn.fd, self._slot, inheritable=False)
        except OSError:
            return
        sock = None
        try:
            sock = socket.socket(fileno=self._slot)
            host, port = sock.getpeername()[:2]
            if (_host(host), port) == (conn.host, conn.port):
                sock.shutdown(socket.SHUT_RDWR)
                self.evicted += 1
                self._refusals.refused(conn.host, f"dropped a connection: {self._over_bound}", time.monotonic())
        except (OSError, ValueError, TypeError):
            pass
        finally:
            if sock is not None:
                sock.detach()
            os.dup2(self._null, self._slot, inheritable=False)


def _host(address: str) -> str:
    """A peer address as one key per host: IPv4-mapped IPv6 written as IPv4."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)
