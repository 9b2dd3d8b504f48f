"""`Replicator`: sends a ps's shards to its successor in the ring, from a background thread.

The serving thread decides when a replica is due (`due`), takes a consistent copy of the shards
(`PsService.own_replica`, a copy as for a checkpoint's `snapshot`) and hands it over (`offer`);
the replicator's own thread sends it with its own RpcClient (RpcClient is not thread-safe) and
logs what it cost (replication_log.py: the first copy, then a summary a minute). One replica is
in flight at a time: while one is being sent, `due` says no, so a slow successor never queues
copies up in memory. A successor that does not answer is
logged (once per outage) and tried again at the next interval; replication never stops training.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from shoal.ps.errors import PsError
from shoal.ps.protocol import Op, ReplicateReply, ReplicateRequest
from shoal.ps.replication_log import ReplicationLog
from shoal.wire import JobSecret, RpcClient, Security, WireError, wait_all

log = logging.getLogger(__name__)

CLOSE_CHECK_EVERY_S = 0.1  # how often a send in flight looks whether the ps is closing


class _Closing(Exception):
    """The ps closes while a replica is in flight: the send is abandoned, not waited out."""


@dataclass(frozen=True)
class ReplicationOptions:
    """When a ps sends its shards to its successor: every `every_s` seconds and/or every
    `every_steps` of its steps, whichever comes first, and only if its step moved since the last
    replica. Both None (the default): no replication; a restarted ps is rebuilt from the newest
    checkpoint. `timeout_s` bounds one send."""

    every_s: float | None = None
    every_steps: int | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.every_s is not None and not self.every_s > 0:
            raise PsError(f"replication every_s={self.every_s!r} must be > 0 seconds, or None for off "
                          "(--replicate_every_secs 0 turns it off)")
        if self.every_steps is not None and (isinstance(self.every_steps, bool) or self.every_steps < 1):
            raise PsError(f"replication every_steps={self.every_steps!r} must be >= 1, or None for off")
        if not self.timeout_s > 0:
            raise PsError(f"replication timeout_s={self.timeout_s!r} must be > 0 seconds")

    @property
    def enabled(self) -> bool:
        return self.every_s is not None or self.every_steps is not None


@dataclass(frozen=True)
class ReplicationCost:
    """What one replica cost: bytes sent, ms to copy the shards on the serving thread, ms to send."""

    step: int
    nbytes: int
    copy_ms: float
    send_ms: float


class Replicator:
    """Sends ps `source`'s replicas to its successor at `successor_address`.

    `due` and `offer` are called from the serving thread; the send runs on the replicator's
    thread. `start()` starts that thread (no I/O in the constructor); `close()` stops it and
    closes its connection, abandoning a send in flight; idempotent. An unexpected error in a
    send is logged with its traceback and the next interval tries again. `clock` is
    time.monotonic unless a test injects one.
    """

    def __init__(self, source: int, successor: int, successor_address: str, secret: JobSecret,
                 options: ReplicationOptions, *, security: Security = Security.AUTO,
                 clock: Callable[[], float] = time.monotonic):
        self.source = source
        self.successor = successor
        self.options = options
        self._address = successor_address
        self._secret = secret
        self._security = security
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: tuple[ReplicateRequest, Mapping[str, np.ndarray], float] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._offered_step: int | None = None
        self._offered_at = clock()
        self._failing = False
        self._log = ReplicationLog(source, successor, clock=clock)
        self.last: ReplicationCost | None = None  # the last replica the successor took
        self.sent = 0

    def start(self) -> "Replicator":
        """Start the sending thread. Returns self. Does not block."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"shoal-replicate-ps{self.source}", daemon=True)
            self._thread.start()
            log.info("ps:%d replicates the shards it holds (if any) to ps:%d at %s every %s", self.source,
                     self.successor, self._address, _interval(self.options))
        return self

    def due(self, step: int) -> bool:
        """Whether a replica of `step` should be taken now: none is being sent, the step moved
        since the last one, and an interval passed. Serving thread; does not block."""
        with self._lock:
            if self._busy or self._closed or step == self._offered_step:
                return False
        o = self.options
        if self._offered_step is None:
            return True
        if o.every_steps is not None and step - self._offered_step >= o.every_steps:
            return True
        return o.every_s is not None and self._clock() - self._offered_at >= o.every_s

    def offer(self, request: ReplicateRequest, tensors: Mapping[str, np.ndarray], copy_ms: float) -> None:
        """Hand a copy of the shards (owned by the replicator from now on) to the sending thread.
        Serving thread; does not block."""
        with self._wake:
            self._offered_step, self._offered_at = request.step, self._clock()
            self._pending, self._busy = (request, tensors, copy_ms), True
            self._wake.notify()

    def close(self) -> None:
        """Stop sending; a send in flight is abandoned within CLOSE_CHECK_EVERY_S, so a ps that
        stops is not held by a successor that no longer answers. Blocks about that long at most.
        Idempotent."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_CHECK_EVERY_S * 10)

    def _run(self) -> None:
        rpc = RpcClient(self._address, self._secret, f"ps:{self.successor}", self.options.timeout_s,
                        security=self._security)
        try:
            while True:
                with self._wake:
                    while self._pending is None and not self._closed:
                        self._wake.wait()
                    if self._closed:
                        return
                    job, self._pending = self._pending, None
                try:
                    self._send(rpc, *job)
                except _Closing:
                    return
                except Exception:  # a bug here must not end replication unseen; training goes on
                    log.exception("ps:%d could not replicate step %d to ps:%d; trying again at the next interval",
                                  self.source, job[0].step, self.successor)
                    rpc.reset()
                finally:
                    with self._lock:
                        self._busy = False
        finally:
            rpc.close()

    def _abandon_if_closing(self, waited_s: float, peers) -> None:
        if self._closed:
            raise _Closing()

    def _send(self, rpc: RpcClient, request: ReplicateRequest, tensors: Mapping[str, np.ndarray],
              copy_ms: float) -> None:
        started = time.monotonic()
        nbytes = sum(t.nbytes for t in tensors.values())
        try:
            rid = rpc.send(Op.REPLICATE.value, request.fields(), tensors)
            reply = ReplicateReply.decode(wait_all([(rpc, rid)], self.options.timeout_s, progress=self._abandon_if_closing,
                                                   progress_every_s=CLOSE_CHECK_EVERY_S)[0].header)
        except (WireError, PsError) as e:
            if not self._failing:
                log.warning("ps:%d could not replicate step %d to ps:%d at %s (%s); its shards since its last "
                            "replica would be lost if it died now; trying again every %s", self.source,
                            request.step, self.successor, self._address, e, _interval(self.options))
            self._failing = True
            rpc.reset()
            return
        cost = ReplicationCost(request.step, nbytes, copy_ms, (time.monotonic() - started) * 1000)
        self.last, self.sent = cost, self.sent + 1
        if self._failing:
            self._log.resumed()
        self._failing = False
        self._log.copied(request.step, len(tensors), nbytes, copy_ms, cost.send_ms, reply.held_step)


def _interval(options: ReplicationOptions) -> str:
    parts = ([f"{options.every_s:g}s"] if options.every_s is not None else []) + \
            ([f"{options.every_steps} steps"] if options.every_steps is not None else [])
    return " or ".join(parts) or "never"
