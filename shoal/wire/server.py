"""RpcServer: a ROUTER socket that authenticates peers and hands each request to a handler."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import zmq

from shoal.errors import ShoalError
from shoal.wire.bad_requests import ERROR_TEXT_MAX, BadRequestLog, bounded
from shoal.wire.bell_desk import BellDesk, BellLine
from shoal.wire.doorbell import BELL_KEY, BELL_MAX_BYTES
from shoal.wire.endpoint import bind_endpoint, is_ipv6
from shoal.wire.errors import BindError, ProtocolError
from shoal.wire.gatekeeper import ZAP_DOMAIN, Gatekeeper
from shoal.wire.limits import ConnectionLimits, raise_open_file_limit
from shoal.wire.mechanisms import mechanism_for
from shoal.wire.memory import keep_freed_memory
from shoal.wire.message import Into, Message, decode_body, decode_header, encode, frame_bytes
from shoal.wire.secret import JobSecret
from shoal.wire.security import Security
from shoal.wire.shared_area import ACK_KEY, BLOCK_KEY, OFFER_KEY, packed_nbytes
from shoal.wire.shared_attach import AttachedArea, AttachedAreas
from shoal.wire.sockio import NOBLOCK, ZERO_COPY_MIN_BYTES, recv_message, send_message

log = logging.getLogger(__name__)

DESK_RETRY_S = 30.0  # after the doorbell could not be opened (out of descriptors), try again this much later


@dataclass(eq=False)
class Request:
    """One decoded request and the peer it came from. Reply to it with `RpcServer.reply`.

    `peer`: the zmq routing id of its client, or the doorbell line it came on (its reply goes
    back there if it is a header alone); `area`: the client's shared-memory area the request
    named (its reply's tensors may go into the request's block there); `shared_ok`: the answer
    to that, sent with the reply (None: the request named none); `bell`: the doorbell address
    the reply names (to a request through zmq that named an attached area); `replied`: a reply
    was sent (a second one never writes into the block, which the client has had back since)."""

    peer: bytes | BellLine
    message: Message
    area: AttachedArea | None = None
    shared_ok: bool | None = None
    bell: str | None = None
    replied: bool = False

    @property
    def op(self) -> str:
        return self.message.header["op"]

    @property
    def header(self) -> dict[str, Any]:
        return self.message.header

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        return self.message.tensors


Handler = Callable[[Request], None]


class RpcServer:
    """Serves requests on one address; only peers holding the job secret get through.

    A peer with the wrong secret is refused during the zmq handshake (ZAP; PLAIN or CURVE as
    `security` resolves for the bound address: by default PLAIN on loopback, CURVE otherwise)
    and never reaches the handler; a peer that sends a malformed message gets an error reply.
    Either way the server keeps serving everyone else. `limits` bound what peers that have not
    authenticated can cost (shoal/wire/limits.py).

    A client on this machine may offer a shared-memory area (shoal/wire/shared_area.py): its
    requests' tensors then arrive in it and the replies' go back into it, and the headers on a
    doorbell line that skips zmq (shoal/wire/doorbell.py; `bell_requests` counts the requests
    that came on one). Such tensors are
    copied out before the handler sees them, unless `borrows(header)` says the handler is done
    with that request's tensors once it has replied: they are then read-only views of the
    client's memory (no copy), which the handler must not keep past its reply. With
    `shared_memory` false, every offer is refused. `shared_requests` counts the requests whose
    tensors came through shared memory.

    Not thread-safe: `start`, `serve_once`, `reply` and `close` must be called from one
    thread (the serving thread). The handler runs on that thread and must reply to each
    request, now or later (deferred replies are how synchronous training waits).
    """

    def __init__(self, address: str, secret: JobSecret, handler: Handler, name: str = "server",
                 into: Into | None = None, *, security: Security = Security.AUTO,
                 limits: ConnectionLimits = ConnectionLimits(), borrows: Callable[[dict], bool] | None = None,
                 shared_memory: bool = True):
        self.address = address
        self.name = name
        self.limits = limits
        self._requested_security = security
        self._into = into  # where request tensors may be decoded to (see message.decode)
        self._secret = secret
        self._handler = handler
        self._ctx: zmq.Context | None = None
        self._gate: Gatekeeper | None = None
        self._sock: zmq.Socket | None = None
        self._wait_ms: int | None = None  # the socket's RCVTIMEO, set by serve_once
        self._borrows = borrows or False
        self._shared_memory = shared_memory
        self._areas = AttachedAreas(name)
        self._desk = BellDesk(name, self._areas)
        self._desk_retry_at = 0.0  # the doorbell could not be opened: not again before this (monotonic)
        self.shared_requests = 0
        self.bell_requests = 0
        self._bad = BadRequestLog(log, name)

    @property
    def security(self) -> Security:
        """The mechanism this server uses: PLAIN or CURVE."""
        return self._requested_security.resolve(self.address)

    def start(self) -> None:
        """Bind and start authenticating. Raises BindError if the address cannot be used.

        Also raises this process's soft open-file limit to its hard limit (process-wide), so
        that connections do not run it out of descriptors."""
        keep_freed_memory()
        raise_open_file_limit()
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        self.limits.apply(sock)
        mechanism = mechanism_for(self._requested_security, self.address, self._secret)
        mechanism.configure_server(sock)
        sock.zap_domain = ZAP_DOMAIN
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a client that connects again keeps its routing id (RpcClient)
        if is_ipv6(self.address):
            sock.setsockopt(zmq.IPV6, 1)
        self._gate = Gatekeeper(self._ctx, self.limits, mechanism.check, self.name)
        self._gate.start(sock)  # before bind: zmq lets everyone in while no ZAP handler listens
        endpoint = bind_endpoint(self.address)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            sock.close()
            self.close()
            if e.errno == errno.EADDRINUSE:
                raise BindError(f"port of {self.name} ({self.address}) is in use; stop the process holding it "
                                "or give this task another port in the cluster spec") from e
            raise BindError(f"{self.name} cannot listen on {self.address} ({endpoint}): {e}; "
                            "use an address of this machine") from e
        self._sock = sock
        self._wait_ms = None
        log.debug("%s listening on %s (%s)", self.name, endpoint, mechanism.security.name)

    def serve_once(self, timeout_ms: int) -> bool:
        """Handle at most one request, waiting up to `timeout_ms`. Returns whether one came. Blocks."""
        if len(self._areas):
            self._areas.sweep()  # (a clock read, unless due)
        if self._desk.active:  # clients on this machine: wait on their lines and zmq together
            got = self._desk.wait(timeout_ms)
            if got is False:
                return False
            if got is not True:
                self.bell_requests += 1
                self._handle_guarded(got[0], [got[1]])
                return True
            try:
                frames = recv_message(self._sock, NOBLOCK)
            except zmq.Again:
                return False
        else:
            if timeout_ms != self._wait_ms:  # (an option of zmq's, no system call)
                self._sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
                self._wait_ms = timeout_ms
            try:
                # A blocking receive that gives up after timeout_ms: a poll, then a receive, would
                # cost a request two more system calls and a second pass through zmq's command queue.
                frames = recv_message(self._sock)
            except zmq.Again:
                return False
        self._gate.trusted(frames[0].get(zmq.SRCFD))  # it sent a message: it has authenticated
        self._handle_guarded(frames[0].bytes, frames[1:])
        return True

    def _handle_guarded(self, peer: bytes | BellLine, body: list) -> None:
        """`_handle`, where nothing one request does — not even its answer failing — ends the
        serving loop: the request is dropped and that is logged (its client's wait times out)."""
        try:
            self._handle(peer, body)
        except Exception as e:
            log.error("%s dropped a request it could not handle or answer: %s", self.name, bounded(repr(e)))
            log.debug("%s: the request's traceback", self.name, exc_info=True)

    def _handle(self, peer: bytes | BellLine, body: list) -> None:
        """Decode one request (`body`: its header frame, then its tensors' frames) and run the
        handler on it; a malformed one gets an error reply."""
        area = shared_ok = bell = None
        try:
            if not body:
                raise ProtocolError("empty message")
            header = decode_header(frame_bytes(body[0]))
            offer = header.get(OFFER_KEY)
            if offer is not None:  # the area this request may use, attached on first sight
                area = self._areas.attach(offer) if self._shared_memory else None
                shared_ok = area is not None
                if area is not None and type(peer) is bytes:
                    area.peer = peer
                    bell = self._bell_name()
                    for line, queued in self._desk.queued(area):  # sent on its line before this one
                        self.bell_requests += 1
                        self._handle(line, [queued])
                elif area is None and BLOCK_KEY in header:  # (e.g. its client closed the area since)
                    self._refuse_unattached(peer, header, shared_ok)
                    return
            message = decode_body(header, body, self._into, area.view if area is not None else None,
                                  self._borrows)
            if not isinstance(message.header.get("op"), str):
                raise ProtocolError(f"request header field 'op' must be a string, got {message.header.get('op')!r:.80}")
        except ProtocolError as e:
            self._bad.refused(str(e), time.monotonic())
            error = {"rid": _rid_of(body), "ok": False, "error": bounded(f"malformed message: {e}")}
            if shared_ok is not None:
                error[ACK_KEY] = shared_ok
            self._send(peer, error, None, False)
            return
        if BLOCK_KEY in header:
            self.shared_requests += 1
        request = Request(peer, message, area, shared_ok, bell)
        try:
            self._handler(request)
        except ShoalError as e:
            self.reply_error(request, str(e))
        except Exception as e:  # a bug in a handler must not take the server down
            log.error("%s failed handling %r: %s", self.name, request.op, bounded(repr(e)),
                      exc_info=len(repr(e)) <= ERROR_TEXT_MAX)  # (a traceback would quote a long one in full)
            self.reply_error(request, f"internal error in {self.name} handling {request.op!r}: {e!r}")

    def _refuse_unattached(self, peer: bytes | BellLine, header: dict, shared_ok: bool | None) -> None:
        """Answer a request whose tensors are in an area this server could not attach (logged at
        INFO by the attach): not malformed. Its client closed the area after sending it (it
        reset, having given up on the request), or this server cannot attach areas now (a
        server started again, out of room); the answer tells the client to use the socket."""
        self._send(peer, {"rid": header["rid"], "ok": False, ACK_KEY: shared_ok,  # (decode_header checked rid)
                          "error": "the shared-memory area holding the request's tensors could not be attached; "
                                   "its next requests go through the socket"}, None, False)

    def _bell_name(self) -> str | None:
        """The doorbell's address, opened at the first attached area (None if it cannot be)."""
        if not self._desk.active and time.monotonic() >= self._desk_retry_at:
            try:
                self._desk.open(self._sock)
            except OSError as e:
                log.info("%s: no doorbell for clients on this machine for now (their headers go through zmq): %s",
                         self.name, e)
                self._desk_retry_at = time.monotonic() + DESK_RETRY_S
        return self._desk.name

    def reply(self, request: Request, fields: dict[str, Any] | None = None,
              tensors: Mapping[str, np.ndarray] | None = None, track: bool = False) -> zmq.MessageTracker | None:
        """Send a successful reply. With `track`, returns a tracker that is done once zmq no
        longer reads the tensors' memory (wait on it before modifying them in place)."""
        header = _reply_header(request, dict(fields or {}, ok=True))
        block = request.header.get(BLOCK_KEY)
        first, request.replied = not request.replied, True
        if block is not None and tensors and first and self._reply_into_block(request, header, tensors, block):
            return None
        return self._send(request.peer, header, tensors, track)

    def _reply_into_block(self, request: Request, header: dict, tensors: Mapping[str, np.ndarray], block: list) -> bool:
        """Send the reply with its tensors written into the request's block, in the area the
        request came in (synchronously: nothing to track). False if they do not fit or the area
        was let go of (its client reset or exited): the reply then goes as frames."""
        if packed_nbytes(tensors) > block[1]:
            return False
        try:
            into = (block[0], request.area.view(block[0], block[1]))
        except ValueError:
            return False
        frames = encode(header, tensors, into)
        peer = self._route(request.peer, frames)
        if peer is not None:
            send_message(self._sock, [peer, *frames], copied=2)
        return True

    def reply_error(self, request: Request, error: str) -> None:
        """Send an error reply; an `error` longer than ERROR_TEXT_MAX characters is cut there."""
        request.replied = True
        self._send(request.peer, _reply_header(request, {"ok": False, "error": bounded(error)}), None, False)

    def _send(self, peer: bytes | BellLine, header: dict, tensors, track: bool):
        frames = encode(header, tensors)
        peer = self._route(peer, frames)
        if peer is None:
            return None
        frames = [peer, *frames]
        if track:  # only frames sent zero-copy are tracked: a reply of small ones needs no tracker
            track = any(type(f) is memoryview and f.nbytes >= ZERO_COPY_MIN_BYTES for f in frames[2:])
        if not track:
            send_message(self._sock, frames, copied=2)
            return None
        # send_multipart would return only the last frame's tracker; watch every zero-copy frame.
        trackers = []
        for i, frame in enumerate(frames):
            flags = zmq.SNDMORE if i < len(frames) - 1 else 0
            if isinstance(frame, memoryview) and frame.nbytes >= ZERO_COPY_MIN_BYTES:
                trackers.append(self._sock.send(frame, flags, copy=False, track=True))
            else:
                self._sock.send(frame, flags)  # copied: bytes, or a frame too small to track
        return zmq.MessageTracker(*trackers) if trackers else None

    @staticmethod
    def _route(peer: bytes | BellLine, frames: list) -> bytes | None:
        """Send a message on the doorbell line `peer` if it can go there (a header alone, and the
        line takes it now): None then; else the zmq routing id to send it to."""
        if type(peer) is bytes:
            return peer
        if len(frames) == 1 and len(frames[0]) <= BELL_MAX_BYTES and peer.send(frames[0]):
            return None
        zmq_peer = peer.zmq_peer()
        if zmq_peer is None:
            log.debug("a reply to a doorbell request had no way back (its client went)")
        return zmq_peer

    def close(self) -> None:
        """Stop listening. Idempotent."""
        self._desk.close()
        self._areas.close()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _reply_header(request: Request, fields: dict) -> dict:
    """`fields` with the request's id and, if it named a shared area, the answer to that (and
    the doorbell's address)."""
    fields["rid"] = request.message.rid
    if request.shared_ok is not None:
        fields[ACK_KEY] = request.shared_ok
        if request.bell is not None:
            fields[BELL_KEY] = request.bell
    return fields


def _rid_of(body) -> int:
    """Best-effort request id of a malformed message, so its sender can match the error."""
    try:
        import msgpack
        header = msgpack.unpackb(frame_bytes(body[0]), raw=False)
        rid = header.get("rid") if isinstance(header, dict) else None
        return rid if isinstance(rid, int) and not isinstance(rid, bool) and rid >= 0 else 0
    except Exception:
        return 0
