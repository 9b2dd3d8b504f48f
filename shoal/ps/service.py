"""What each op does to one ps task's shards. The ops and their fields: `shoal.ps.protocol`,
docs/wire-protocol.md.

`PsService.handle` decodes a request with its op's type, runs the op's handler from a table,
and returns the replies to send: the handler's own, unless it is DEFERRED (a sync push waits for
its step, a pull for `min_step`), plus any deferred replies the request released. The service
never touches a socket, so it is tested without one; `shoal.ps.server` sends what it returns.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from shoal.ps.errors import PsError
from shoal.ps.lease_desk import LeaseDesk
from shoal.ps.optimizers import rule_from_config
from shoal.ps.protocol import (REQUEST_TYPES, DoneReply, DoneRequest, Empty, FailedRequest, InitReply, InitRequest,
                               LeaseRequest, Mode, Op, Phase,
                               PullReply, PullRequest, PushOutcome, PushReply, PushRequest, ShutdownRequest,
                               SnapshotReply, StatusReply, TrainingMode, parse_op, split_slots)
from shoal.ps.store import ShardStore
from shoal.ps.sync import SyncAggregator
from shoal.ps.sync_wait import SyncWait, SyncWaitWatch, sync_wait
from shoal.wire import Request

log = logging.getLogger(__name__)

_BUFFERED_BYTES = 256 << 10  # smaller gradients are decoded without a copy (np.frombuffer)


@dataclass(frozen=True)
class Reply:
    """A reply to send to `request`. `shards` names the shards whose live values are among
    `tensors`: the sender must tell the store when zmq is done reading them (copy-on-write)."""

    request: Request
    body: Any
    tensors: Mapping[str, np.ndarray] | None = None
    shards: Sequence[str] = ()


class Deferred:
    """A handler's answer when its reply waits for a later step."""


DEFERRED = Deferred()


@dataclass
class _Waiting:
    request: Request
    names: Sequence[str]
    min_step: int
    outcome: PushOutcome | None = None  # a sync push waiting for its step; None for a pull
    pushed: Sequence[str] = ()  # a sync push: answered once these shards hold min_step's values


class PsService:
    """Handles requests for one ps task. Runs on the serving thread only (not thread-safe).

    `on_job_over(reason)` is called once every replica said `done`, when one said `shutdown`,
    or when every replica said `failed` and none is done (nobody is left to train). A replica
    that failed and comes back is counted again when it says `done`.

    `replica_names` (chief first, then workers) lets a sync step name the replicas it waits
    for, in its status replies and in the log (`log_sync_wait`); `clock` is time.monotonic
    unless a test injects one.
    """

    def __init__(self, task_name: str, num_replicas: int, on_job_over: Callable[[str], None], *,
                 replica_names: Sequence[str] = (), clock: Callable[[], float] = time.monotonic):
        self.task_name = task_name
        self.num_replicas = num_replicas
        self.replica_names = tuple(replica_names)
        self._clock = clock
        self._sync_watch = SyncWaitWatch()
        self.store = ShardStore(task_name)
        self.incarnation = secrets.token_hex(8)  # tells workers this process is new after a restart
        self._on_job_over = on_job_over
        self._phase = Phase.EMPTY
        self._training: TrainingMode | None = None
        self._sync: SyncAggregator | None = None
        self._async_step = 0
        self._created = 0
        self._done: set[str] = set()
        self._failed: set[str] = set()
        self._draining = False
        self._waiting: list[_Waiting] = []
        self._released: list[Reply] = []
        self._leases = LeaseDesk(task_name, self.incarnation)  # ps 0: dynamic data sharding
        self._handlers: dict[Op, Callable[[Request, Any], Reply | Deferred]] = {
            Op.STATUS: self._status, Op.INIT: self._init, Op.SNAPSHOT: self._snapshot, Op.READY: self._ready,
            Op.PULL: self._pull, Op.PUSH: self._push, Op.DONE: self._done_op, Op.FAILED: self._failed_op,
            Op.SHUTDOWN: self._shutdown, Op.LEASE: self._lease,
        }

    @property
    def step(self) -> int:
        return self._sync.step if self._sync is not None else self._async_step

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def unfinished_replicas(self) -> int:
        """Training replicas that have not said `done` or `failed` yet."""
        return max(0, self.num_replicas - len(self._done | self._failed))

    @property
    def all_done(self) -> bool:
        """Whether every training replica said `done` (the job ran to its end)."""
        return len(self._done) >= self.num_replicas

    def has_finished(self, task: str) -> bool:
        """Whether replica `task` ("worker:0") said `done` or `failed` (and did not come back)."""
        return task in self._done or task in self._failed

    def handle(self, request: Request) -> list[Reply]:
        """Run one request; returns the replies to send now, in order. Raises PsError (the
        sender's error reply) for a request that is bad or cannot be served."""
        op = parse_op(request.op)
        message = REQUEST_TYPES[op].decode(request.header)
        reply = self._handlers[op](request, message)
        released, self._released = self._released, []
        return released if reply is DEFERRED else [reply, *released]

    def drain(self) -> list[Reply]:
        """This ps got SIGTERM: the job is ending and no replica will join a step late. From now on
        a sync step that the replicas still training can no longer complete (some stopped a step
        earlier) is given up: its pushes are answered as stale, with the values of the last
        finished step, so the chief ends its step and can snapshot a final checkpoint. Returns
        the replies to send now. Idempotent."""
        self._draining = True
        self._give_up_stuck_step()
        released, self._released = self._released, []
        return released

    def tensor_destination(self, header: dict, name: str, dtype, shape) -> np.ndarray | None:
        """Where a push's large gradient is received: the shard's reusable buffer, so a big
        push does not allocate (and page-fault in) a fresh array every step."""
        if header.get("op") != Op.PUSH.value or math.prod(shape) * dtype.itemsize < _BUFFERED_BYTES:
            return None
        return self.store.gradient_buffer(name, dtype, shape)

    # --- the ops ---------------------------------------------------------------------------

    def _status(self, request: Request, _message) -> Reply:
        wait = self._sync_wait()
        have, needed, missing = (wait.have, wait.needed, wait.missing) if wait is not None else ((), 0, ())
        return Reply(request, StatusReply(self._phase, self._training, self.step, len(self.store), self.store.nbytes,
                                          self._created, tuple(sorted(self._done)), self.incarnation,
                                          have, needed, missing, self._leases.counts()))

    def _sync_wait(self) -> SyncWait | None:
        if self._sync is None:
            return None
        return sync_wait(self._sync.step, self._sync.contributors, self._sync.waiting_for, self.replica_names,
                         self._done)

    def log_sync_wait(self) -> None:
        """Log what the current sync step waits for once it has waited long enough (then every
        so often; see SyncWaitWatch). Call it often, from the serving thread."""
        waited = self._sync_watch.due(self._clock())
        wait = self._sync_wait() if waited is not None else None
        if wait is not None and wait.waiting:
            missing = f"; is {' / '.join(wait.missing)} running?" if wait.missing else ""
            log.info("%s: %s, for %.0fs%s", self.task_name, wait.describe(), waited, missing)

    def _init(self, request: Request, message: InitRequest) -> Reply:
        rule = rule_from_config(message.rule)
        if self._training is not None and message.training != self._training:
            raise PsError(f"{self.task_name} already runs {self._training} training, a worker asked for "
                          f"{message.training}; start every worker with the same --sync setting")
        values, slots = split_slots(request.tensors)
        first = self._phase is Phase.EMPTY
        self._created += self.store.create(values, rule, slots)
        if first:
            self._training = message.training
            if message.training.mode is Mode.SYNC:
                self._sync = SyncAggregator(message.training.replicas, step=message.step)
            else:
                self._async_step = message.step
            self._phase = Phase.CREATED
            self._leases.restore(message.leases)
        self._done.update(message.done)
        log.info("%s holds %d shards (%.1f MB), %s, %s", self.task_name, len(self.store),
                 self.store.nbytes / 1e6, rule.to_config(), self._training)
        return Reply(request, InitReply(self._created))

    def _snapshot(self, request: Request, _message) -> Reply:
        if self._phase is Phase.EMPTY:
            raise PsError(f"{self.task_name} has no variables to snapshot yet (not initialized)")
        return Reply(request, SnapshotReply(self.step, self._training, self.store.rule.to_config(),
                                            self._leases.export()),
                     self.store.snapshot())

    def _ready(self, request: Request, _message) -> Reply:
        if self._phase is Phase.EMPTY:
            raise PsError(f"{self.task_name} got 'ready' before 'init'")
        self._phase = Phase.READY
        return Reply(request, Empty())

    def _pull(self, request: Request, message: PullRequest) -> Reply | Deferred:
        for name in message.names:
            self.store.check_name(name)
        return self._answer_or_wait(_Waiting(request, message.names, message.min_step))

    def _push(self, request: Request, message: PushRequest) -> Reply | Deferred:
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} is not initialized yet; wait for the chief before pushing")
        grads = request.tensors
        for name, grad in grads.items():
            self.store.check(name, grad.shape, grad.dtype)
        if message.hyper is not None and message.hyper.keys() != grads.keys():
            raise PsError(f"{message.task}'s push names a learning rate for {sorted(message.hyper)[:5]} but pushes "
                          f"{sorted(grads)[:5]}; a push carries hyper-parameters for exactly its shards")
        if message.hyper is not None:
            self.store.rules_for(message.hyper)  # refuse a push the rule cannot take before counting it
        self._leases.check_push(message)  # bad `used` positions refuse the push before it counts
        names = list(grads) if message.pull else []
        if self._sync is None:
            self.store.apply(grads, message.hyper)
            self._leases.account(message, PushOutcome.APPLIED, None)
            if message.ends_step:
                self._async_step += 1
                self._release()  # pulls waiting for a step (min_step) are answered in async mode too
            return self._reply_values(_Waiting(request, names, 0, PushOutcome.APPLIED))
        if message.step > self._sync.step:
            raise PsError(f"{message.task} pushed for step {message.step} but {self.task_name} is at step "
                          f"{self._sync.step}; pull before pushing")
        outcome = self._sync.add(message.task, message.step, grads)
        self._leases.account(message, outcome, message.step)
        if outcome is PushOutcome.DUPLICATE:
            return self._reply_values(_Waiting(request, names, 0, outcome))
        if outcome is PushOutcome.STALE:  # answered with the values of the step after the one it missed
            return self._answer_or_wait(_Waiting(request, names, message.step + 1, outcome))
        self._waiting.append(_Waiting(request, names, message.step + 1, PushOutcome.APPLIED, tuple(grads)))
        ready = self._sync.take(self.store.names())  # only shards of this push can have just completed
        if ready:
            self.store.apply(ready, message.hyper)
            self._release()
        if self._sync.step > message.step:
            self._sync_watch.step_completed()
            self._leases.step_reached(self._sync.step)
        else:
            self._sync_watch.gradient_arrived(self._sync.step, self._clock())
            self._give_up_stuck_step()
        return DEFERRED

    def _done_op(self, request: Request, message: DoneRequest) -> Reply:
        self._done.add(message.task)
        self._failed.discard(message.task)
        self._member_left(message.task)
        if len(self._done) >= self.num_replicas:
            self._on_job_over(f"all {self.num_replicas} workers finished")
        self._give_up_stuck_step()
        return Reply(request, DoneReply(len(self._done)))

    def _failed_op(self, request: Request, message: FailedRequest) -> Reply:
        if message.task not in self._done:
            self._failed.add(message.task)
            log.warning("%s: %s left training by an error", self.task_name, message.task)
        self._member_left(message.task)
        if not self._done and len(self._failed) >= self.num_replicas:
            self._on_job_over(f"all {self.num_replicas} workers failed")
        self._give_up_stuck_step()
        return Reply(request, Empty())

    def _lease(self, request: Request, message: LeaseRequest) -> Reply:
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} is not initialized yet; wait for the chief before leasing data")
        return Reply(request, self._leases.lease(message))

    def _member_left(self, task: str) -> None:
        """`task` left training (said done or failed; later: its heartbeat expired)."""
        self._leases.release(task)

    def _shutdown(self, request: Request, message: ShutdownRequest) -> Reply:
        self._on_job_over(f"{message.task} ended the job")
        return Reply(request, Empty())

    # --- deferred replies ------------------------------------------------------------------

    def _answer_or_wait(self, waiting: _Waiting) -> Reply | Deferred:
        if self.step >= waiting.min_step:
            return self._reply_values(waiting)
        self._waiting.append(waiting)
        return DEFERRED

    def _give_up_stuck_step(self) -> None:
        """While draining: if the replicas still training cannot bring the current sync step its
        gradients any more, drop it and queue its waiting pushes' replies as stale."""
        sync = self._sync
        if not self._draining or sync is None:
            return
        contributors = sync.contributors
        yet_to_come = self.num_replicas - len(self._done | self._failed | contributors)
        if len(contributors) + max(0, yet_to_come) >= sync.replicas:
            return
        if contributors:
            log.info("%s: giving up sync step %d (%d of %d gradients; the other replicas have stopped)",
                     self.task_name, sync.step, len(contributors), sync.replicas)
        sync.abandon()
        self._leases.step_abandoned(sync.step)
        still = []
        for w in self._waiting:
            if w.outcome in (PushOutcome.APPLIED, PushOutcome.STALE) and w.min_step > sync.step:
                self._released.append(self._reply_values(_Waiting(w.request, w.names, 0, PushOutcome.STALE)))
            else:
                still.append(w)
        self._waiting = still

    def _release(self) -> None:
        """Queue the replies of every waiting request whose step has come."""
        still = []
        for w in self._waiting:
            if self.step >= w.min_step or (w.pushed and self._sync.applied(w.pushed, w.min_step - 1)):
                self._released.append(self._reply_values(w))
            else:
                still.append(w)
        self._waiting = still

    def _reply_values(self, w: _Waiting) -> Reply:
        # a sync push part may be answered before the step ends: its shards are already at min_step
        body = PullReply(self.step) if w.outcome is None else PushReply(max(self.step, w.min_step), w.outcome)
        return Reply(w.request, body, self.store.values(w.names), w.names)
