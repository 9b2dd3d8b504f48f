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

from shoal.ps.adoption import CatchUp, Position, place_adopted
from shoal.ps.closure_ledger import DEFAULT_WINDOW, ClosureLedger
from shoal.ps.errors import PsError
from shoal.ps.lease_desk import LeaseDesk
from shoal.ps.optimizers import rule_from_config
from shoal.ps.membership import DEFAULT_JOIN_GRACE_S, LIVE, Change, MemberState, Membership, quorum
from shoal.ps.protocol import (MAX_JOINED, REQUEST_TYPES, AdoptReply, ChangeKind, JoinedPs, JoinReply, JoinRequest,
                               PlaceRequest, PlacementChange, ReleaseReply, ReleaseRequest, ReleaseState, AdoptRequest, DoneReply, DoneRequest, Empty, FailedRequest, HeartbeatReply,
                               HeartbeatRequest, InitReply, InitRequest, LeaseRequest, Mode, Op, Phase,
                               PullReply, PullRequest, PushOutcome, PushReply, PushRequest, ReplicaRequest,
                               ReplicateReply, ReplicateRequest, ShutdownRequest, SnapshotReply, StatusReply,
                               TrainingMode, parse_op, split_slots)
from shoal.ps.replicas import ReplicaBook
from shoal.ps.store import ShardStore
from shoal.ps.sync import SyncAggregator
from shoal.ps.sync_wait import SyncWait, SyncWaitWatch, sync_wait
from shoal.wire import CHUNK_BYTES, Request
from shoal.wording import byte_size, counted

log = logging.getLogger(__name__)

# A gradient that arrived in one frame is decoded without a copy (np.frombuffer of zmq's buffer,
# which the allocator reuses); only one in several chunks needs a buffer to be put together in.
_BUFFERED_BYTES = CHUNK_BYTES + 1
_PUSH = Op.PUSH.value  # (read per request: an Enum member's `.value` is a descriptor call)


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

    Who trains is the membership (shoal/ps/membership.py): the replicas of the ps's cluster
    (`replica_names`, chief first; "worker:0".."worker:<num_replicas - 1>" if not given) are
    expected, any replica joins with a heartbeat, and leaves by `done`, `failed` or a missed
    heartbeat (`tick` drops those). `on_job_over(reason)` is called once the chief said done
    and no member trains any more, when one said `shutdown`, or when every member said
    `failed` (nobody is left to train). A replica that failed and comes back is counted again.
    In sync mode a step aggregates (live members - backups) gradients, backups being the
    replicas of the cluster beyond the `replicas` the chief's init asks for.

    Shard replication (issue 14): this ps is ps `ps_index` of a ring of `num_ps`; it holds its
    predecessor's replica (`replicate`, `replica`: shoal/ps/replicas.py) and `own_replica` copies
    its own shards for its successor. In async mode a push whose `basis` names another process
    of this ps is dropped as ROLLED_BACK (its values were rolled back by a failover).
    A push tagged with a closure (in-graph training) is applied at most once per tag and shard:
    `closures` (a ClosureLedger remembering the `closure_window` latest tags) answers a repeat
    DUPLICATE with the current values.

    Re-homing (issue 14, shoal/ps/adoption.py): `adopt` gives this ps shards of a ps that never
    came back; `status` then names the re-homed ps (`retired`), so workers learn the new
    placement; adopted shards one sync step behind catch up with the workers' resent gradients.

    `clock` is time.monotonic unless a test injects one.
    """

    def __init__(self, task_name: str, num_replicas: int, on_job_over: Callable[[str], None], *,
                 replica_names: Sequence[str] = (), clock: Callable[[], float] = time.monotonic,
                 join_grace_s: float = DEFAULT_JOIN_GRACE_S, ps_index: int = 0, num_ps: int = 1,
                 closure_window: int = DEFAULT_WINDOW):
        self.task_name = task_name
        self.num_replicas = num_replicas
        self.replica_names = tuple(replica_names) or tuple(f"worker:{i}" for i in range(num_replicas))
        self._clock = clock
        self.membership = Membership(self.replica_names, self.replica_names[0] if self.replica_names else None,
                                     clock(), join_grace_s=join_grace_s)
        self._sync_hyper: dict[str, Any] = {}  # sync: each shard's hyper of its latest push this step
        self._sync_watch = SyncWaitWatch()
        self.store = ShardStore(task_name)
        self.incarnation = secrets.token_hex(8)  # tells workers this process is new after a restart
        self._on_job_over = on_job_over
        self._phase = Phase.EMPTY
        self._training: TrainingMode | None = None
        self._sync: SyncAggregator | None = None
        self._backups = 0
        self._async_step = 0
        self._created = 0
        self._draining = False
        self._waiting: list[_Waiting] = []
        self._released: list[Reply] = []
        self._leases = LeaseDesk(task_name, self.incarnation)  # ps 0: dynamic data sharding
        self.replicas = ReplicaBook(ps_index, num_ps, clock=clock)
        self.ps_index = ps_index
        self.closures = ClosureLedger(closure_window)  # pushes of scheduled closures: applied once
        self.retired: list[int] = []  # ps tasks whose shards were re-homed (`adopt`), in that order
        self._catch_up = CatchUp()  # adopted shards one sync step behind
        self.num_ps = num_ps
        self.joined: dict[int, str] = {}  # ps 0: the ps tasks that registered (`join`), at most MAX_JOINED
        self.moved_away: dict[str, int] = {}  # shards released (`release`) -> the ps they moved to
        self.history: list[PlacementChange] = []  # the placement's changes (`place`, `adopt`), in order
        self._handlers: dict[Op, Callable[[Request, Any], Reply | Deferred]] = {
            Op.STATUS: self._status, Op.INIT: self._init, Op.SNAPSHOT: self._snapshot, Op.READY: self._ready,
            Op.PULL: self._pull, Op.PUSH: self._push, Op.DONE: self._done_op, Op.FAILED: self._failed_op,
            Op.SHUTDOWN: self._shutdown, Op.HEARTBEAT: self._heartbeat, Op.LEASE: self._lease,
            Op.REPLICATE: self._replicate, Op.REPLICA: self._replica, Op.ADOPT: self._adopt,
            Op.JOIN: self._join, Op.RELEASE: self._release_shards, Op.PLACE: self._place,
        }

    @property
    def step(self) -> int:
        return self._sync.step if self._sync is not None else self._async_step

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def unfinished_replicas(self) -> int:
        """Members still training (expected or heartbeating)."""
        return len(self.membership.training)

    @property
    def all_done(self) -> bool:
        """Whether the job ran to its end: the chief said done and no member trains any more."""
        chief = self.membership.chief
        return (chief is not None and self.membership.state(chief) is MemberState.DONE
                and not self.membership.training)

    def has_finished(self, task: str) -> bool:
        """Whether replica `task` ("worker:0") said `done` or `failed` (and did not come back)."""
        return self.membership.state(task) in (MemberState.DONE, MemberState.FAILED)

    def tick(self) -> list[Reply]:
        """Drop members whose heartbeat is overdue (a sync step then completes without them).
        Call it often, from the serving thread. Returns the replies released."""
        self._membership_changed(self.membership.expire(self._clock()))
        released, self._released = self._released, []
        return released

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

    def own_replica(self) -> tuple[ReplicateRequest, dict[str, np.ndarray]] | None:
        """A copy of this ps's shards (values and slots, all of one step) to send its successor,
        or None when there is nothing consistent to copy now: the ps is not initialized (or
        holds no shard), or a
        sync step has applied some shards but not all (try again a moment later). Serving
        thread; copies every shard (as `snapshot` does for a checkpoint)."""
        if self._phase is Phase.EMPTY or not len(self.store) or (self._sync is not None and not self._sync.between_steps):
            return None
        request = ReplicateRequest(self.ps_index, self.incarnation, self.step, self._training,
                                   self.store.rule.to_config(), self._leases.export())
        return request, self.store.snapshot()

    @staticmethod
    def reads_tensors_in_place(header: dict) -> bool:
        """Whether the request's tensors may stay where they arrived (a client's shared memory,
        which it rewrites once answered) rather than be copied: a push's gradients are applied,
        or summed into the step's own arrays (SyncAggregator copies a shard's first gradient),
        before `handle` returns; nothing keeps them (tests/unit/test_ps_service.py checks it)."""
        return header.get("op") == _PUSH

    def tensor_destination(self, header: dict, name: str, dtype, shape) -> np.ndarray | None:
        """Where a push's gradient of several chunks is received: the shard's reusable buffer,
        so a big push does not allocate (and page-fault in) a fresh array every step."""
        if header.get("op") != _PUSH or math.prod(shape) * dtype.itemsize < _BUFFERED_BYTES:
            return None
        return self.store.gradient_buffer(name, dtype, shape)

    # --- the ops ---------------------------------------------------------------------------

    def _status(self, request: Request, _message) -> Reply:
        wait = self._sync_wait()
        have, needed, missing = (wait.have, wait.needed, wait.missing) if wait is not None else ((), 0, ())
        done = tuple(sorted(self.membership.tasks_in(MemberState.DONE)))
        return Reply(request, StatusReply(self._phase, self._training, self.step, len(self.store), self.store.nbytes,
                                          self._created, done, self.incarnation, have, needed, missing,
                                          self.membership.version, self.membership.training,
                                          self._leases.counts(), tuple(self.retired),
                                          tuple(JoinedPs(i, a) for i, a in sorted(self.joined.items())),
                                          tuple(self.history)))

    def _sync_wait(self) -> SyncWait | None:
        if self._sync is None:
            return None
        return sync_wait(self._sync.step, self._sync.contributors, self._sync.waiting_for, self.membership.training,
                         self.membership.tasks_in(MemberState.DONE))

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
        book = self._leases.load(message.leases) if first else None  # a damaged one refuses init before any change
        self._created += self.store.create(values, rule, slots)
        if first and message.members is not None:  # a rebuild: follow the other ps's membership
            self._membership_changed(self.membership.adopt(message.members, self._clock()))
        if first:
            self._training = message.training
            if message.training.mode is Mode.SYNC:
                self._backups = max(0, len(self.replica_names) - message.training.replicas)
                self._sync = SyncAggregator(self._quorum(), step=message.step, backups=self._backups)
            else:
                self._async_step = message.step
            self._phase = Phase.CREATED
            self._leases.install(book)
        for task in message.done:
            self._membership_changed([self.membership.finished(task)])
        log.info("%s holds %s (%s), %s, %s%s", self.task_name, counted(len(self.store), "shard"),
                 byte_size(self.store.nbytes), rule.to_config(), self._training,
                 "" if len(self.store) else " (the placement gives it no variable: it answers the job's status"
                 " and heartbeats, and stops with it)")
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
        moved = tuple(n for n in message.names if n in self.moved_away) if self.moved_away else ()
        if moved:  # the worker learns the new placement and pulls from the new home
            return Reply(request, PullReply(self.step, self.incarnation, moved))
        for name in message.names:
            self.store.check_name(name)
        return self._answer_or_wait(_Waiting(request, message.names, message.min_step))

    def _push(self, request: Request, message: PushRequest) -> Reply | Deferred:
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} is not initialized yet; wait for the chief before pushing")
        grads = request.tensors
        moved = tuple(n for n in grads if n in self.moved_away) if self.moved_away else ()
        if moved:  # not applied, not counted: the worker sends the part again by the new placement
            if message.used is not None:  # ps 0's part: the resend may go to the new ps only, so count them now
                self._leases.account(message, PushOutcome.APPLIED, None if self._sync is None else message.step,
                                     self._leases.check_push(message))
            return Reply(request, PushReply(self.step, PushOutcome.MOVED, moved=moved))
        for name, grad in grads.items():
            self.store.check(name, grad.shape, grad.dtype)
        if message.empty and self._sync is None:
            raise PsError(f"{message.task} pushed empty (no data for a sync step), which only a sync ps takes; "
                          f"{self.task_name} trains asynchronously: start every task with the same --sync")
        if message.hyper is not None and message.hyper.keys() != grads.keys():
            raise PsError(f"{message.task}'s push names a learning rate for {sorted(message.hyper)[:5]} but pushes "
                          f"{sorted(grads)[:5]}; a push carries hyper-parameters for exactly its shards")
        if message.hyper is not None:
            self.store.check_hyper(message.hyper)  # refuse a push the rule cannot take before counting it
        checked = self._leases.check_push(message)  # bad `used` positions refuse the push before it counts
        names = list(grads) if message.pull else []
        self.membership.seen(message.task, self._clock())
        if self._sync is None and message.basis and message.basis != self.incarnation:
            # computed on values of an earlier process of this ps, which a failover rolled back: the
            # restored values may already hold it (it reached the replica), so it is never applied
            self._leases.account(message, PushOutcome.ROLLED_BACK, None, checked)
            return self._reply_values(_Waiting(request, names, 0, PushOutcome.ROLLED_BACK))
        if message.closure is not None and self.closures.is_duplicate(message.closure, grads.keys()):
            log.info("%s: %s pushed %s again (a re-run closure); already applied, answered duplicate",
                     self.task_name, message.task, message.closure)
            self._leases.account(message, PushOutcome.DUPLICATE, None if self._sync is None else message.step, checked)
            if self._sync is None:
                return self._reply_values(_Waiting(request, names, 0, PushOutcome.DUPLICATE))
            # answered as the original is: once its step is applied to these shards, with those
            # values, so the re-run's next push belongs to the next step (sent for this one, it
            # would be a second gradient of its task in this step, dropped)
            step = self.closures.step_of(message.closure)
            return self._answer_when_applied(_Waiting(request, names, step + 1, PushOutcome.DUPLICATE, tuple(grads)))
        if self._sync is None:
            self._record_closure(message, grads)
            self.store.apply(grads, message.hyper)
            self._leases.account(message, PushOutcome.APPLIED, None, checked)
            if message.ends_step:
                self.membership.count_applied(message.task)
                self._async_step += 1
                self._release()  # pulls waiting for a step (min_step) are answered in async mode too
            return self._reply_values(_Waiting(request, names, 0, PushOutcome.APPLIED))
        caught = self._adopted_push(request, message, names)
        if caught is not None:
            return caught
        if message.step > self._sync.step:
            raise PsError(f"{message.task} pushed for step {message.step} but {self.task_name} is at step "
                          f"{self._sync.step}; pull before pushing")
        outcome = self._sync.add(message.task, message.step, grads, empty=message.empty)
        self._leases.account(message, outcome, message.step, checked)
        if outcome is PushOutcome.DUPLICATE:
            return self._reply_values(_Waiting(request, names, 0, outcome))
        if outcome is PushOutcome.STALE:  # answered with the values of the step after the one it missed
            return self._answer_or_wait(_Waiting(request, names, message.step + 1, outcome))
        self._record_closure(message, grads)
        if message.ends_step and not message.empty:  # an empty push brings no gradient
            self.membership.count_applied(message.task)
        self._waiting.append(_Waiting(request, names, message.step + 1, PushOutcome.APPLIED, tuple(grads)))
        if message.hyper is not None:
            self._sync_hyper.update(message.hyper)
        self._apply_completed_shards()
        if self._sync.step <= message.step:
            self._sync_watch.gradient_arrived(self._sync.step, self._clock())
            self._give_up_stuck_step()
        return DEFERRED

    def _record_closure(self, message: PushRequest, grads: Mapping[str, Any]) -> None:
        if message.closure is not None:
            self.closures.record(message.closure, grads.keys(), message.step if self._sync is not None else 0)

    def _done_op(self, request: Request, message: DoneRequest) -> Reply:
        self._membership_changed([self.membership.finished(message.task)])
        self._give_up_stuck_step()
        return Reply(request, DoneReply(len(self.membership.tasks_in(MemberState.DONE))))

    def _failed_op(self, request: Request, message: FailedRequest) -> Reply:
        change = self.membership.failed(message.task, message.incarnation, message.terminated, message.started)
        if change is not None and not message.terminated and message.started:
            log.warning("%s: %s left training by an error", self.task_name, message.task)
        self._membership_changed([change])
        self._give_up_stuck_step()
        return Reply(request, Empty())

    def _heartbeat(self, request: Request, message: HeartbeatRequest) -> Reply:
        # a new process of a training replica: the old one leaves first, so a sync step stops
        # waiting for its gradient (its leases go back when the new one leases: the book knows
        # each holder; and the job is not over in between)
        self._membership_changed([self.membership.replaced(message.task, message.incarnation)], replacing=True)
        now = self._clock()
        change = self.membership.heartbeat(message.task, message.incarnation, message.timeout_ms / 1000, now,
                                           message.answer)
        self._membership_changed([change])
        return Reply(request, HeartbeatReply(self.membership.version, change is not None,
                                             len(self.membership.training),
                                             self.membership.challenge(message.task, message.incarnation, now)))

    def _replicate(self, request: Request, message: ReplicateRequest) -> Reply:
        return Reply(request, ReplicateReply(self.replicas.accept(message, request.tensors)))

    def _replica(self, request: Request, message: ReplicaRequest) -> Reply:
        body, tensors = self.replicas.reply(message.source)
        return Reply(request, body, tensors)

    def _adopt(self, request: Request, message: AdoptRequest) -> Reply:
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} got 'adopt' before it was initialized; only a ready ps takes over the "
                          f"shards of ps:{message.source}")
        values, slots = split_slots(request.tensors)
        new = [name for name in values if name not in self.store.names()]
        self.store.create(values, self.store.rule, slots)
        created = len(new)
        for name in new:
            self.moved_away.pop(name, None)  # moved back here (a later growth or re-homing)
        if not message.moving:
            for i in message.retired:
                if i not in self.retired:
                    self.retired.append(i)
                    self.history.append(PlacementChange(ChangeKind.RETIRE, i))
        position = place_adopted(self._sync, self._catch_up, new, message.step)
        log.info("%s took over %d shards (%.1f MB) of ps:%d, of step %d, at its step %d (%s); re-homed so far: %s",
                 self.task_name, created, sum(v.nbytes for v in values.values()) / 1e6, message.source,
                 message.step, self.step, position.value, ", ".join(f"ps:{i}" for i in self.retired) or "none")
        if position is Position.AHEAD:
            self._apply_completed_shards()
        return Reply(request, AdoptReply(created, self.step))

    def _join(self, request: Request, message: JoinRequest) -> Reply:
        if self.ps_index != 0:
            raise PsError(f"{self.task_name} got 'join' from ps:{message.index}; ps tasks register with ps:0 only")
        known = self.joined.get(message.index)
        if known is not None and known != message.address:
            raise PsError(f"ps:{message.index} registered already at {known}, now {message.address} asks to join as "
                          f"ps:{message.index}; a ps added to a running job takes the index above the highest that "
                          f"ever ran (ps:{max(self.joined) + 1}), or restart it at {known}")
        if known is None and len(self.joined) >= MAX_JOINED:
            raise PsError(f"{self.task_name} registers at most {MAX_JOINED} ps tasks; ps:{message.index} at "
                          f"{message.address} is one too many (start the job with fewer ps tasks)")
        if known is None:
            self.joined[message.index] = message.address
            log.info("%s: ps:%d registered at %s", self.task_name, message.index, message.address)
        return Reply(request, JoinReply(len(self.joined), self.num_ps, retired=message.index in self.retired))

    def _release_shards(self, request: Request, message: ReleaseRequest) -> Reply:
        """Stop serving shards (they move to a ps that joined) and hand them over; see ReleaseRequest."""
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} got 'release' before it was ready; only a ready ps hands shards over")
        for name in message.names:
            self.store.check_name(name)
        step = self.step
        if self._sync is not None:
            applied = [n for n in message.names if self._sync.applied([n], self._sync.step)]
            busy = None
            if applied and len(applied) != len(message.names):
                busy = (f"{self.task_name} has applied step {self._sync.step} to {applied[:3]} but not to all of "
                        f"{list(message.names)[:5]}; ask again in a moment (release takes shards of one step)")
            elif self._catch_up.behind(self._sync.step + 1, message.names):
                busy = (f"{self.task_name}: some of {list(message.names)[:5]} still catch up a step after "
                        "re-homing; ask again in a moment")
            if busy is not None:
                return Reply(request, ReleaseReply(self.step, ReleaseState.BUSY, busy))
            step = self._sync.step + 1 if applied else self._sync.step
            self._sync.forget(message.names)
        tensors = self.store.release(message.names)
        for name in message.names:
            self.moved_away[name] = message.target
        self._answer_moved(set(message.names))
        if self._sync is not None:
            self._apply_completed_shards()  # the rest of the step may be complete without them
        log.info("%s released %d shards (%.1f MB) of step %d to ps:%d", self.task_name, len(message.names),
                 sum(v.nbytes for v in tensors.values()) / 1e6, step, message.target)
        return Reply(request, ReleaseReply(step), tensors)

    def _answer_moved(self, moved: set[str]) -> None:
        """Answer MOVED every waiting request that names a released shard, so none waits for ever."""
        still = []
        for w in self._waiting:
            hit = tuple(n for n in (*w.names, *w.pushed) if n in moved)
            if not hit:
                still.append(w)
            elif w.outcome is None:
                self._released.append(Reply(w.request, PullReply(self.step, self.incarnation, tuple(dict.fromkeys(hit)))))
            else:
                self._released.append(Reply(w.request, PushReply(self.step, PushOutcome.MOVED,
                                                                 moved=tuple(dict.fromkeys(hit)))))
        self._waiting = still

    def _place(self, request: Request, message: PlaceRequest) -> Reply:
        known = tuple(self.history)
        if message.history[:len(known)] != known:
            raise PsError(f"{self.task_name}'s placement history {[c.fields() for c in known][:6]} is not a prefix of "
                          f"the one sent {[c.fields() for c in message.history][:6]}; every placement change goes "
                          "through the chief, one at a time")
        self.history = list(message.history)
        # a ps rebuilt after a restart learns the retirements here: a later `adopt` must not add them again
        for change in self.history:
            if change.kind is ChangeKind.RETIRE and change.ps not in self.retired:
                self.retired.append(change.ps)
        return Reply(request, Empty())

    def _adopted_push(self, request: Request, message: PushRequest, names: Sequence[str]) -> Reply | Deferred | None:
        """A sync push of adopted shards that lag a step (their gradient of that step, resent
        after re-homing): counted on its own, answered once they caught up. None for any other
        push (a newer step for lagging shards means their lagging step's gradients are lost:
        they stop lagging, and the push counts as usual)."""
        grads = request.tensors
        if not self._catch_up.behind(message.step + 1, grads.keys()):
            return None
        if message.step != self._catch_up.step or not self._catch_up.covers(grads.keys()):
            waited_for = self._catch_up.step
            lost = self._catch_up.give_up()
            log.warning("%s: %s pushed step %d for adopted shards that still wait for step %d; that step's "
                        "update of %d shards is lost", self.task_name, message.task, message.step,
                        waited_for, len(lost))
            self._release()
            return None
        outcome, ready, hyper = self._catch_up.add(message.task, message.step, grads, message.hyper, message.empty)
        if outcome is PushOutcome.DUPLICATE:
            return self._reply_values(_Waiting(request, names, 0, outcome))
        if ready:
            self.store.apply(ready, hyper)
        self._waiting.append(_Waiting(request, names, message.step + 1, PushOutcome.APPLIED, tuple(grads)))
        self._release()
        return DEFERRED

    def _lease(self, request: Request, message: LeaseRequest) -> Reply:
        if self._phase is not Phase.READY:
            raise PsError(f"{self.task_name} is not initialized yet; wait for the chief before leasing data")
        return Reply(request, self._leases.lease(message))

    def _shutdown(self, request: Request, message: ShutdownRequest) -> Reply:
        self._on_job_over(f"{message.task} ended the job")
        return Reply(request, Empty())

    # --- membership ------------------------------------------------------------------------

    def _membership_changed(self, changes: Sequence[Change | None], replacing: bool = False) -> None:
        """Log each change, follow it with the sync quorum (a step that a departure completed is
        applied now), and end the job if it is over. `replacing`: the departure of a process
        whose successor joins next (its leases and the job's end are left to that)."""
        changes = [c for c in changes if c is not None]
        if not changes:
            return
        log.info("%s %s; %s", self.task_name, self.membership.describe(), "; ".join(c.describe() for c in changes))
        for change in changes:
            if change.after not in LIVE and not replacing:
                # its unconsumed positions go back to the queue
                self._leases.release(change.task, "finished" if change.after is MemberState.DONE else "left")
        if self._sync is not None and any(c.live_changed for c in changes):
            self._sync.set_quorum(self._quorum(), self.membership.training)
            self._apply_completed_shards()
            self._catch_up.set_quorum(self._quorum(), self.membership.training)
            lagging = self._catch_up.lagging
            caught_up, hyper = self._catch_up.complete()
            if caught_up:  # adopted shards that waited for the departed replica's gradient
                self.store.apply(caught_up, hyper)
            if caught_up or self._catch_up.lagging != lagging:  # (or only empty pushes came: no update)
                self._release()
        reason = None if replacing else self.membership.job_over()
        if reason is not None:
            self._on_job_over(reason)

    def _quorum(self) -> int:
        return quorum(self.membership.training, self._backups)

    def _apply_completed_shards(self) -> None:
        """Apply the sync averages of the shards whose step has its gradients; release waiters."""
        step, applied = self._sync.step, self._sync.applied_count
        ready = self._sync.take(self.store.names())
        if ready:
            hyper = {name: self._sync_hyper[name] for name in ready} if self._sync_hyper.keys() >= ready.keys() else None
            self.store.apply(ready, hyper)
        # a shard that only empty pushes completed has nothing to apply, and its part replies are due;
        # a departure can complete the step with nothing to apply
        if ready or self._sync.applied_count != applied or self._sync.step > step:
            self._release()
        if self._sync.step > step:
            self._sync_hyper = {}
            self._leases.step_reached(self._sync.step)
            self._sync_watch.step_completed()  # (a departure too: the next step has not waited yet)

    # --- deferred replies ------------------------------------------------------------------

    def _answer_or_wait(self, waiting: _Waiting) -> Reply | Deferred:
        """The reply now if its step has come (`_step_has_come`), else once it has."""
        if self._step_has_come(waiting):
            return self._reply_values(waiting)
        self._waiting.append(waiting)
        return DEFERRED

    _answer_when_applied = _answer_or_wait  # a sync push: once step `min_step - 1` is applied to its shards

    def _step_has_come(self, w: _Waiting) -> bool:
        """Whether `w`'s step has come: the ps reached `min_step`, or (a push) its shards have
        step `min_step - 1` applied; never while adopted shards it names still catch up."""
        if self._catch_up.behind(w.min_step, w.names, w.pushed):
            return False
        return self.step >= w.min_step or bool(w.pushed and self._sync.applied(w.pushed, w.min_step - 1))

    def _give_up_stuck_step(self) -> None:
        """While draining: if the replicas still training cannot bring the current sync step its
        gradients any more, drop it and queue its waiting pushes' replies as stale."""
        sync = self._sync
        if not self._draining or sync is None:
            return
        contributors = sync.contributors
        yet_to_come = len(set(self.membership.training) - contributors)
        if len(contributors) + max(0, yet_to_come) >= sync.replicas:
            return
        if contributors:
            log.info("%s: giving up sync step %d (%d of %d gradients; the other replicas have stopped)",
                     self.task_name, sync.step, len(contributors), sync.replicas)
        sync.abandon()
        self._leases.step_abandoned(sync.step)
        still = []
        for w in self._waiting:
            if w.outcome in (PushOutcome.APPLIED, PushOutcome.STALE, PushOutcome.DUPLICATE) and w.min_step > sync.step:
                self._released.append(self._reply_values(_Waiting(w.request, w.names, 0, PushOutcome.STALE)))
            else:
                still.append(w)
        self._waiting = still

    def _release(self) -> None:
        """Queue the replies of every waiting request whose step has come."""
        still = []
        for w in self._waiting:
            if self._step_has_come(w):
                self._released.append(self._reply_values(w))
            else:
                still.append(w)
        self._waiting = still

    def _reply_values(self, w: _Waiting) -> Reply:
        # a sync push part may be answered before the step ends: its shards are already at min_step
        body = (PullReply(self.step, self.incarnation) if w.outcome is None
                else PushReply(max(self.step, w.min_step), w.outcome, self.incarnation if w.names else ""))
        return Reply(w.request, body, self.store.values(w.names), w.names)
