"""TrainingSession: a worker's connection to the parameter servers (between-graph replication).

A small front composed of parts, each with one job: a `PsClient` (requests to every ps, resent
after a lost ps), `PsRecovery` (waits for a lost ps), `ChiefDuties` (initialize, rebuild; chief
only), a `Checkpointer` (when to save, saving; chief with a model dir), `TaskSummaries` and
`GracefulStop` (SIGTERM ends training at a step boundary, after the chief's final checkpoint).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from shoal.cluster import ClusterConfig, ClusterError
from shoal.logs_default import show_shoal_logs
from shoal.ps.client import Answer, PsClient
from shoal.ps.errors import ShardsMoved
from shoal.ps.optimizers import UpdateRule
from shoal.ps.protocol import (ASYNC, SLOT_SEPARATOR, ChangeKind, Hyper, Mode, PushOutcome, StatusReply, TrainingMode,
                               UsedPositions)
from shoal.train.checkpointer import Checkpointer, SaveReason
from shoal.train.chief import ChiefDuties
from shoal.train.closure_tags import ClosureTags
from shoal.train.errors import TrainError
from shoal.ps.membership import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from shoal.train.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_S, Heartbeats
from shoal.train.idle_ps import IdlePsRestarts
from shoal.train.leased_data import LeasedBatch, LeasedBatches
from shoal.train.local_state import LocalState
from shoal.train.options import CheckpointOptions, SessionState, StepResult, SyncOptions
from shoal.train.push_overlap import OutgoingPush, PushOverlap
from shoal.train.ps_watch import DEFAULT_EVERY_S, PsWatch, WatchState
from shoal.train.part_size import PartSize, part_bytes_for
from shoal.train.placement import Placement, PlacementStrategy, place_variables
from shoal.train.recovery import PsRecovery, wait_for_chief, wait_for_ps
from shoal.train.shard_costs import shard_costs_for
from shoal.train.growing import Growing
from shoal.train.placement_history import (PlacementBook, PlacementChanged, apply_history, learn_history,
                                           settled_history)
from shoal.train.rehoming import MOVE_GRACE_S, PsRehomed, Rehoming, resend_moved
from shoal.train.stalls import StallReporter
from shoal.train.shutdown import GracefulStop, TrainingTerminated
from shoal.train.summaries import TaskSummaries
from shoal.train.waiting import LOG_EVERY_S
from shoal.wire import JobSecret, Security, WireError
from shoal.wire.endpoint import is_on_this_host
from shoal.wire.sockio import ZERO_COPY_MIN_BYTES

log = logging.getLogger(__name__)

__all__ = ["CheckpointOptions", "SessionState", "StepResult", "SyncOptions", "TrainingSession", "TrainingTerminated"]


class TrainingSession:
    """Pulls parameters from and pushes gradients to the ps tasks of a cluster.

    The chief initializes the variables on the ps exactly once (from the newest checkpoint in
    `model_dir` when there is one); other workers wait for it (bounded by `init_timeout_s`,
    logging while they wait). Every request is bounded by `request_timeout_s`: a dead ps is a
    clear error, never a hang. `secret` is the job secret, resolved at the program's edge
    (`shoal.resolve_job_secret(os.environ)`). `security` is the wire's (shoal/wire/security.py;
    AUTO: PLAIN to a loopback ps, CURVE between hosts); the ps tasks must resolve the same.
    With `shared_memory` (the default), pushes to a ps on this host (loopback, or one of its own
    addresses) carry their tensors through shared memory (shoal/wire/shared_area.py) instead of
    the socket.

    With a `model_dir`, the chief saves checkpoints there (see CheckpointOptions) and every task
    writes TensorBoard summaries (`summaries`). If a ps task dies and is started again, the
    chief rebuilds its shards from the newest checkpoint and every worker resends what it lost;
    workers wait up to `ps_recovery_timeout_s` for that; then, with `rehome_lost_ps` (the
    default; every worker the same), a ps other than ps 0 is re-homed: its shards move to the
    other ps tasks and training goes on without it (shoal/train/rehoming.py; `placement` is
    then the new one); without it, or for ps 0, they fail with a clear error.

    A push travels in parts of about `push_part_bytes` (None: one message per ps); large
    variables are cut into shards of that size. AUTO picks by where the ps tasks are
    (shoal/train/part_size.py): 4 MiB parts when every ps is on loopback, 256 KiB otherwise.
    A variable of 2 x `min_shard_bytes` or more is cut across ps (shards of at least
    `min_shard_bytes`, at most one per ps), and the greedy placement counts a request's cost in
    bytes; None picks both by where the ps are (shoal/train/shard_costs.py): on one machine a
    model of a few megabytes sits on one ps.

    `local_state` (optional) holds tensors this worker keeps itself that belong in checkpoints
    (a PyTorch module's buffers, see shoal/train/local_state.py): the chief's are saved with
    the variables, exported, and restored when the chief initializes the job from a checkpoint.
    SIGTERM (`shoal kill`, a deadline, preemption) while the session is started, on the main
    thread, ends training at the next step boundary: the chief saves a checkpoint, and `push`
    raises `TrainingTerminated` (a SystemExit, exit status 143) on every replica; see
    shoal/train/shutdown.py. A second SIGTERM ends the process at once.

    `params` holds this worker's current copy of every variable (writable numpy arrays, updated
    in place by `push` and `pull`). Calls block; not thread-safe. The constructor does no I/O.
    States (SessionState): NEW -> STARTED -> CLOSED. Use as a context manager, or call `start()`
    then `close()`. Leaving the `with` block normally saves the final checkpoint (chief) and
    tells the ps this replica is done; leaving it by an exception tells them it failed instead,
    so a replica that is restarted is still counted as training (the ps tasks end the job
    early only if every replica failed).
    """

    def __init__(self, config: ClusterConfig, variables: Mapping[str, Any], optimizer: UpdateRule, *,
                 secret: JobSecret, sync: bool | SyncOptions = False, max_steps: int | None = None,
                 placement: PlacementStrategy = PlacementStrategy.GREEDY,
                 min_shard_bytes: int | None = None,
                 push_part_bytes: int | None | PartSize = PartSize.AUTO,
                 model_dir: str | os.PathLike | None = None, checkpoints: CheckpointOptions = CheckpointOptions(),
                 summary_every_steps: int = 100,
                 request_timeout_s: float = 60.0, init_timeout_s: float = 120.0, ps_recovery_timeout_s: float = 120.0,
                 security: Security = Security.AUTO, local_state: LocalState | None = None,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S, rehome_lost_ps: bool = True,
                 shared_memory: bool = True, overlap_push: bool = False):
        if config.task.job not in ("chief", "worker"):
            raise TrainError(f"{config.task} is not a training replica; only chief and worker tasks train "
                             "(ps tasks run shoal.Server)")
        bad = [name for name in variables if SLOT_SEPARATOR in name]
        if bad:
            raise TrainError(f"variable names may not contain {SLOT_SEPARATOR!r} (it marks optimizer state): {bad[:5]}")
        self.config = config
        self.task = str(config.task)
        self.params = {name: np.array(value, copy=True, order="C") for name, value in variables.items()}
        untrainable = [f"{name!r} ({value.dtype})" for name, value in self.params.items() if value.dtype.kind != "f"]
        if untrainable:
            raise TrainError(f"variables {', '.join(untrainable[:5])} are not floating point: the ps update variables"
                             " with gradients, so each must be float16, float32 or float64 (e.g. np.zeros(10,"
                             " np.float32), not [0] * 10); keep counters and masks in the program, not among them")
        self.optimizer = optimizer
        self.training = _training_mode(sync, config.num_replicas)
        # sync without an explicit replicas_to_aggregate: join whatever quorum the ps runs
        self._elastic_sync = sync is True or (isinstance(sync, SyncOptions) and sync.replicas_to_aggregate is None)
        self.max_steps = max_steps
        self._push_part_bytes = part_bytes_for(push_part_bytes, config.ps_addresses)
        self._zeros: dict[str, np.ndarray] | None = None  # `_push_empty`'s gradients, made at its first call
        self._first_ps = _first_ps(config)
        self._chief: ChiefDuties | None = None
        self.checkpointer: Checkpointer | None = None
        costs = shard_costs_for(min_shard_bytes, config.ps_addresses)
        self._use_placement(place_variables(self.params, config.num_ps, placement, costs.min_shard_bytes,
                                            self._push_part_bytes, costs.request_cost_bytes))
        self.model_dir = Path(model_dir) if model_dir else None
        self.request_timeout_s = request_timeout_s
        self.init_timeout_s = init_timeout_s
        self.ps_recovery_timeout_s = ps_recovery_timeout_s
        self.summaries: TaskSummaries | None = None
        if self.model_dir is not None:
            logdir = self.model_dir if config.is_chief else self.model_dir / f"{config.task.job}_{config.task.index}"
            self.summaries = TaskSummaries(logdir, every_steps=summary_every_steps, is_chief=config.is_chief)
            if config.is_chief:
                self.checkpointer = Checkpointer(self.model_dir, checkpoints, self.placement, self.task, local_state)
        self._chief = ChiefDuties(self.task, self.placement, self.params, optimizer, self.training,
                                  self.checkpointer, lambda: self._step, local_state,
                                  history=lambda: self._book.history,
                                  params_step=lambda: self._params_step) if config.is_chief else None
        rebuild = self._chief.rebuild_ps if self._chief is not None else None
        # on the session's thread SIGTERM ends a wait for a lost ps (TrainingTerminated); not on the ps watch's
        recovery = PsRecovery(self.task, str(config.chief_task), ps_recovery_timeout_s, rebuild,
                              stop=lambda: self._stop.stop(self._step, None))
        self._stop = GracefulStop(self.task)
        # what the ps watch runs: in-graph training does not re-home a ps (yet)
        self._rebuild = PsRecovery(self.task, str(config.chief_task), ps_recovery_timeout_s, rebuild)
        self._recovering = threading.Lock()  # the session's own recovery and its ps watch's, one at a time
        self._watch: PsWatch | None = None
        self._secret, self._security = secret, security
        # the placement and its changes (re-homed and joined ps tasks), shared by the parts that change it
        self._book = PlacementBook(self.placement, on_retired=lambda address: self._heartbeats.drop(address))
        # what happens to a lost ps that does not come back in time: the job fails, or it is re-homed
        self._failing_recovery = recovery  # (fail_lost_ps)
        self._recovery: PsRecovery | Rehoming = recovery if not rehome_lost_ps else Rehoming(
            self.task, str(config.chief_task), ps_recovery_timeout_s, recovery, self._book, self._chief)
        stalls = StallReporter(self.task, self.training, request_timeout_s)
        self.ps = PsClient(config.ps_addresses, secret, timeout_s=request_timeout_s, on_lost=self._lost_ps,
                           recovery_timeout_s=ps_recovery_timeout_s, timeout_error=stalls.timeout_error,
                           on_slow=stalls.on_slow, slow_every_s=LOG_EVERY_S, security=security,
                           shared_memory=shared_memory)
        self._shared_memory = shared_memory
        stalls.client = self.ps
        if not MIN_TIMEOUT_S <= heartbeat_timeout_s <= MAX_TIMEOUT_S:
            raise TrainError(f"heartbeat_timeout_s={heartbeat_timeout_s!r} is out of range: give {MIN_TIMEOUT_S:g} to "
                             f"{MAX_TIMEOUT_S:g} seconds (--heartbeat_timeout; default {DEFAULT_HEARTBEAT_TIMEOUT_S:g})")
        self._heartbeats = Heartbeats(self.task, config.ps_addresses, secret, timeout_s=heartbeat_timeout_s,
                                      security=security)
        # a ps added to the running job: the chief moves shards onto it, every worker follows
        self._growing = Growing(self.task, str(config.chief_task), self._book, self._chief,
                                on_joined=self._heartbeats.add, wait_s=request_timeout_s * 2 + MOVE_GRACE_S)
        # a restarted ps that holds no shard gets no push: the chief learns of it from its heartbeats
        self._idle_ps = IdlePsRestarts(self.task, self._heartbeats.take_rejoined, self._chief.rebuild_ps,
                                       self._recovering) if self._chief is not None else None
        self._targets = {s.name: s.rows(self.params[s.variable]) for s in self.placement.shards}
        self._step = 0
        self._params_step = 0  # the step of the values in `params` (the last pull, or push with its reply)
        self._state = SessionState.NEW
        self._holder = secrets.token_hex(8)  # tells ps 0 this process from an earlier one of the same task
        self._closure_tags = ClosureTags()
        if overlap_push and self.sync:
            raise TrainError(f"{self.task}: overlap_push (--overlap_push) is for asynchronous training: a sync "
                             "step's gradients must all be computed on that step's values; drop it or --sync")
        self._overlap = PushOverlap(self._send_push, self._finish_push,
                                    lambda: StepResult(self._step, None)) if overlap_push else None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def sync(self) -> bool:
        """Whether this session trains synchronously."""
        return self.training.mode is Mode.SYNC

    def __enter__(self) -> "TrainingSession":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._close(finished=False, terminated=issubclass(exc_type, TrainingTerminated))
            return
        if self._overlap is not None and self._state is SessionState.STARTED:
            try:
                self._overlap.settle()
            except BaseException as e:  # the last push failed: the ps hear that this replica failed
                self._close(finished=False, terminated=isinstance(e, TrainingTerminated))
                raise
        try:
            if self.checkpointer is not None and self._state is SessionState.STARTED:
                self._rehomed_retry(lambda: self.checkpointer.save(self.ps, export=self.checkpointer.options.export,
                                                                   reason=SaveReason.FINAL))
        finally:
            self.close()

    def start(self) -> "TrainingSession":
        """Connect, initialize (chief) or wait for initialization (others), pull. Blocks.
        If it fails, the session stays NEW and may be started again."""
        self._require(SessionState.NEW, "start")
        show_shoal_logs()
        try:
            if self.checkpointer is not None:
                self.checkpointer.open()
            deadline = time.monotonic() + self.init_timeout_s
            known = len(self._book.history)
            # ps tasks re-homed or joined before this replica started
            changed = learn_history(self._book, self.ps, deadline, self.task, self.init_timeout_s)
            if changed is not None:
                self._use_learned(known, changed)
            statuses = wait_for_ps(self.ps, self.task, deadline, self.init_timeout_s, learn=self._learn_while_waiting)
            if not all(s.ready for s in statuses):
                if self._chief is not None:
                    self._chief.initialize(self.ps)
                    statuses = self.ps.status_all(self.request_timeout_s)
                else:
                    # the wait's own answers: one more round here, outside the wait's recovery,
                    # failed the start of a worker whose ps was killed just after it was ready
                    statuses = self._wait_for_chief(deadline)
            self._check_mode(statuses)
            self.ps.remember_incarnations(statuses)
            self._state = SessionState.STARTED
            self.pull()
            # Heartbeats (membership: a sync step counts this replica) start once the pull agreed on
            # a step, and after the placement history, so they reach every ps together, a ps that
            # joined too. Counted before, a replica whose ps answered from different steps (one saw
            # its join before its current step had a gradient, another after) waited at the newest
            # step for a ps that waited for its gradient of the older one.
            self._heartbeats.start()
        except BaseException:
            self._state = SessionState.NEW
            self._heartbeats.stop()
            self._leave_after_failed_start()
            self.ps.close()
            if self.checkpointer is not None:
                self.checkpointer.close()
            raise
        if self.checkpointer is not None:
            self.checkpointer.mark_saved(self._step)
        if self.summaries is not None:
            self.summaries.open()
        self._stop.open()
        log.info("%s starts at global step %d (%s)%s", self.task, self.global_step,
                 f"sync, {self.training.replicas} of {self.config.num_replicas} replicas per step, following the "
                 "membership" if self.sync
                 else "async", "" if self._shared_memory else _through_the_socket(self.config))
        return self

    def close(self) -> None:
        """Tell every ps this replica is done, then disconnect. Idempotent; never raises."""
        self._close(finished=True)

    def end_job(self) -> None:
        """Stop every ps now, even if other workers have not finished (chief only, usually)."""
        self._require(SessionState.STARTED, "end_job")
        if self._overlap is not None:
            self._overlap.drop()  # the ps stop now: nobody waits for its answer
        try:
            self.ps.shutdown_all(self.task, 5.0)
        finally:
            self.close()

    def _close(self, finished: bool, terminated: bool = False) -> None:
        if self._state is SessionState.CLOSED:
            return
        if finished and self._overlap is not None and self._state is SessionState.STARTED:
            try:  # (a program that closes without a last pull)
                self._overlap.settle()
            except (Exception, TrainingTerminated) as e:  # said, and the ps hear that this replica failed
                finished, terminated = False, isinstance(e, TrainingTerminated)
                if not terminated:
                    log.warning("%s: the push in flight at close failed: %s", self.task, e)
        if self._overlap is not None:
            self._overlap.drop()
        started, self._state = self._state is SessionState.STARTED, SessionState.CLOSED
        if self._watch is not None:
            self._watch.close()
        self._stop.close()
        self._heartbeats.stop()
        if self.summaries is not None:
            self.summaries.close()
        if started:
            try:
                if finished:
                    self.ps.done_all(self.task, 5.0)
                else:
                    self.ps.failed_all(self.task, 2.0, self._heartbeats.incarnation, terminated)
            except WireError as e:
                log.debug("%s: could not tell every ps it %s: %s", self.task, "is done" if finished else "failed", e)
        self.ps.close()
        if self.checkpointer is not None:
            self.checkpointer.close()

    def _leave_after_failed_start(self) -> None:
        """start() failed after the heartbeats began: tell the ps this replica is not training,
        so no sync step waits for it until its heartbeat times out. Best effort, bounded."""
        try:
            self.ps.failed_all(self.task, 2.0, self._heartbeats.incarnation, started=False)
        except WireError as e:
            log.debug("%s: could not tell the ps that start() failed: %s", self.task, e)

    def _require(self, state: SessionState, call: str) -> None:
        if self._state is state:
            return
        if self._state is SessionState.NEW:
            raise TrainError(f"{self.task}: {call}() needs a started session; call start() first "
                             "(or use `with TrainingSession(...) as session:`)")
        if self._state is SessionState.CLOSED:
            raise TrainError(f"{self.task}: {call}() on a closed session; create a new TrainingSession")
        raise TrainError(f"{self.task}: {call}() on a session that is already {self._state.value}")

    # -- training --------------------------------------------------------------------------

    @property
    def global_step(self) -> int:
        return self._step

    @property
    def live_replicas(self) -> int:
        """How many training replicas (chief and workers) the job has now, as ps 0 counted at
        this replica's last heartbeat (the cluster's count until the first reply). A sync step
        averages the gradients of this many (minus backups): scale a learning rate or a batch
        size with it to keep the global batch or the step size constant (docs/elastic.md).
        Does not block."""
        members = self._heartbeats.live_members
        return members if members else self.config.num_replicas

    def should_stop(self) -> bool:
        return self.max_steps is not None and self._step >= self.max_steps

    def push(self, grads: Mapping[str, np.ndarray], hyper: Mapping[str, Hyper] | None = None, *,
             used: LeasedBatch | UsedPositions | None = None) -> StepResult:
        """Send one gradient per variable; on return `params` holds the updated values.

        Async: the ps applies it at once. Sync: returns once the step's aggregate is applied
        (or at once, with applied=False, if the gradient was stale). The chief also saves a
        checkpoint here when one is due. `hyper` (variable -> Hyper, every variable) applies
        this step with those learning rates and weight decays instead of the update rule's own
        (a PyTorch optimizer's param groups, read every step). `used` (a batch from
        `leased_batches`, or its `used`) tells ps 0 which leased positions this gradient used, so
        it counts them consumed once the gradient is applied. After SIGTERM, once the step is
        done: the chief saves a checkpoint and every replica raises TrainingTerminated. Sync: if
        the ps tasks answer from different steps, the session goes on at the oldest (a ps still
        there may need this replica's gradient; the others answer the next push stale), unlike
        `pull`, which waits for the newest. Blocks.

        With `overlap_push` (async only; shoal/train/push_overlap.py) the push goes out and
        returns at once, after the one before it is answered: `params` then holds the values
        that one brought, and the result is that one's.
        """
        self._require(SessionState.STARTED, "push")
        outgoing = self._outgoing(grads, hyper, used)
        if self._overlap is not None:
            return self._overlap.push(outgoing)
        return self._finish_push(self._send_push(outgoing))

    def _outgoing(self, grads: Mapping[str, np.ndarray], hyper: Mapping[str, Hyper] | None,
                  used: LeasedBatch | UsedPositions | None) -> OutgoingPush:
        """`push`'s gradients checked and made sendable. Does not block."""
        if grads.keys() != self.params.keys():
            missing, extra = self.params.keys() - grads.keys(), grads.keys() - self.params.keys()
            raise TrainError(f"gradients must match the variables: missing {sorted(missing)}, unknown {sorted(extra)}")
        arrays = {name: _as_sendable(g, self.params[name].dtype) for name, g in grads.items()}
        if self._overlap is not None:  # zmq sends big arrays without a copy, after push returned: keep them apart
            arrays = {name: g.copy() if g.nbytes >= ZERO_COPY_MIN_BYTES else g for name, g in arrays.items()}
        for name, g in arrays.items():
            if g.shape != self.params[name].shape:
                raise TrainError(f"gradient of {name!r} has shape {g.shape}, the variable has {self.params[name].shape}")
        if isinstance(used, LeasedBatch):
            used = used.used
        closure = self._closure_tags.next_tag()
        if closure is not None and self._overlap is not None:
            raise TrainError(f"{self.task}: a push of a scheduled closure waits for its answer; overlap_push "
                             "(--overlap_push) is for between-graph training: leave it off under a coordinator")
        return OutgoingPush(arrays, hyper, used, closure)

    def _send_push(self, push: OutgoingPush) -> OutgoingPush:
        """Queue `push` to the ps by the current placement. Blocks only while zmq has no room."""
        push.parts = [(ps, {sh.name: sh.rows(push.arrays[sh.variable]) for sh in shards})
                      for ps, shards in self._push_parts]
        push.sent = self.ps.send_push(self.task, self._step, push.parts, self._targets,
                                      self._shard_hyper(push.hyper) if push.hyper is not None else None, push.used,
                                      closure=push.closure, empty=push.empty)
        return push

    def _finish_push(self, push: OutgoingPush) -> StepResult:
        """Wait for `push`'s answers and take them in (values, step); then the step's summaries,
        a grown placement, a restarted ps that holds nothing, a due checkpoint and a pending stop.
        Blocks."""
        parts, hyper, used, closure, arrays = push.parts, push.hyper, push.used, push.closure, push.arrays
        try:
            answers = push.sent.wait()
        except ShardsMoved as moved:  # shards moved to a ps that joined: send those parts to their new home
            resent = self._growing.resend(self.ps, self.task, self._step, moved, parts,
                                          self._shard_hyper(hyper) if hyper is not None else None, used, self._targets,
                                          closure=closure, empty=push.empty)
            self._use_placement(self._book.placement)
            self.pull(min_step=self._step + 1 if self.sync else 0)
            result = StepResult(self._step, all(a.body.outcome in (PushOutcome.APPLIED, PushOutcome.DUPLICATE)
                                                for a in resent))
        except PsRehomed as moved:  # a ps's shards moved while this push waited: finish the step on their new ps
            self._use_placement(moved.placement)
            if self.sync:  # the gradients that went to the lost ps, resent for the step in flight
                resend_moved(self.ps, self.task, self._step, moved, arrays,
                             self._shard_hyper(hyper) if hyper is not None else None, self._targets, closure=closure,
                             empty=push.empty)
                self.pull(min_step=self._step + 1)
            else:  # async: the replica may hold them already; never applied twice
                self.pull()
            result = StepResult(self._step, self.sync)
        else:
            self._assign(answers)
            rolled_back = sorted({ps for (ps, _), a in zip(parts, answers)
                                  if a.body.outcome is PushOutcome.ROLLED_BACK})
            if rolled_back:
                log.info("%s: %s dropped this step's gradient, computed on values its failover rolled back; this "
                         "worker has its restored values now", self.task, ", ".join(f"ps:{ps}" for ps in rolled_back))
            steps = [a.body.step for a in answers]
            if self.sync and len(set(steps)) > 1:
                # The ps tasks answered from different steps (a stale push, or a join that one ps
                # counted a step before another). Go on at the oldest: a ps still there may count
                # this replica's gradient for it, so waiting for the newest could wait forever; the
                # ps already past it answer the next push stale, with their values.
                self._step = min(steps)
            else:
                self._step = max(steps) if self.sync else steps[self._step_part]
            self._params_step = self._step
            result = StepResult(self._step, all(a.body.outcome is PushOutcome.APPLIED for a in answers))
        if self.summaries is not None:
            learning_rate = (next(iter(hyper.values())).learning_rate if hyper
                             else getattr(self.optimizer, "learning_rate", None))
            self.summaries.step_done(self._step, learning_rate)
        if self._chief is not None:  # a ps that joined the job: move shards onto it
            grown = self._growing.check(self.ps)
            if grown is not None:
                self._use_placement(grown)
            self._idle_ps.check(self.ps, self.placement)
        if self.checkpointer is not None:
            self._rehomed_retry(lambda: self.checkpointer.save_if_due(self.ps, self._step))
        self._stop.stop(self._step, self._save_on_term if self.checkpointer is not None else None)
        return result

    def closure(self, closure_id: str):
        """A context manager: the pushes in its block belong to the scheduled closure
        `closure_id` (in-graph training; the coordinator's step executor opens it around each
        closure). Each push carries (closure_id, its index in the block), and a ps applies each
        such push at most once, so a closure re-run after its worker died does not apply again
        what its first run pushed; a repeat returns with `applied=False` and the current values.
        Blocks may not nest. Does not block; not thread-safe."""
        return self._closure_tags.running(closure_id)

    def run_step(self, loss_and_grad: Callable[..., tuple[float, Mapping[str, np.ndarray]]], *batch,
                 used: LeasedBatch | UsedPositions | None = None) -> tuple[float, StepResult]:
        """Compute `loss, grads = loss_and_grad(params, *batch)` and push the gradients (with
        the leased positions they used, see `push`). Blocks."""
        self._require(SessionState.STARTED, "run_step")
        loss, grads = loss_and_grad(self.params, *batch)
        return loss, self.push(grads, used=used)

    def leased_batches(self, num_examples: int, batch_size: int, *, seed: int = 0, lease_size: int | None = None,
                       epochs: int | None = None, shuffle: bool = True, wait_timeout_s: float = 300.0,
                       after_idle_step: Callable[[], None] | None = None) -> LeasedBatches:
        """Batches of example indices leased from ps 0 (dynamic data sharding; see
        shoal/train/leased_data.py and docs/dynamic-sharding.md): every worker asks for the next
        free positions of the epoch, a worker that leaves gives its own back, and the epoch and
        the position are in the chief's checkpoints. Push each batch's gradient with
        `used=batch`. Every worker must pass the same `num_examples` and `seed`. Iterating
        blocks on ps 0 (one request per `lease_size` positions, default 32 batches, at most a
        16th of the data set); not thread-safe (the session's thread only).

        In sync training a worker with no free position takes part in the others' steps with no
        data while it waits (`_push_empty`): `params` may change during `next()`. It calls
        `after_idle_step()`, if given, after each such step, so a model that holds a copy of
        `params` (on a GPU) takes the new values in."""
        def idle_step() -> None:
            self._push_empty()
            if after_idle_step is not None:
                after_idle_step()
        return LeasedBatches(self.ps, self.task, self._holder, num_examples, batch_size, seed=seed,
                             lease_size=lease_size, epochs=epochs, shuffle=shuffle, wait_timeout_s=wait_timeout_s,
                             idle_step=idle_step if self.sync else None)

    def _push_empty(self) -> None:
        """Take part in the current sync step with no data: this replica's leases ran out while
        other replicas finish theirs, and a step that waits for every replica must not wait for
        it. Zeros go out by the placement as a push's gradients would, marked empty: each ps
        then waits for no gradient from this replica in this step and averages the others'
        (shoal/ps/sync.py). The values after the step arrive as after a push. Blocks until the
        step is applied."""
        self._require(SessionState.STARTED, "push")
        if self._zeros is None:
            self._zeros = {name: np.zeros_like(value) for name, value in self.params.items()}
        self._finish_push(self._send_push(OutgoingPush(self._zeros, None, None, None, empty=True)))

    def pull(self, min_step: int = 0) -> int:
        """Refresh `params` from the ps (waiting until every ps that holds a shard reached
        `min_step`). Blocks.

        In sync mode, if the ps tasks answer from different steps (one just finished a step),
        pulls again at the newest, so every worker starts a step from the same parameters.
        """
        self._require(SessionState.STARTED, "pull")
        if self._overlap is not None and self._overlap.in_flight:
            self._overlap.settle()
        answers = self._rehomed_retry(lambda: self.ps.pull_all(self._names_on, min_step, self._targets))
        self._assign(answers)
        steps = [a.body.step for a in answers]  # of the ps that hold a shard, the only ones asked
        if self.sync and len(set(steps)) > 1:
            return self.pull(max(steps))
        self._step = max(steps) if self.sync else steps[0]
        self._params_step = self._step
        return self._step

    def watch_ps(self, every_s: float = DEFAULT_EVERY_S) -> PsWatch:
        """For a chief that never pushes (a coordinator, docs/coordinator.md; `Coordinator(...,
        session=session)` calls it): start watching every ps, every `every_s` seconds, on a
        thread and connections of its own, and rebuild a ps that is lost or restarted as a
        training chief does when its push finds one (from its successor's replica, else the
        newest checkpoint, else the chief's copy), so the workers waiting for it go on.
        Returns the started PsWatch; close it (or this session, which closes it) to stop.
        Does not block. One watch per session; chief only. Not thread-safe (the session's
        thread); the watch's recoveries and the session's own run one at a time."""
        self._require(SessionState.STARTED, "watch_ps")
        if self._chief is None:
            raise TrainError(f"{self.task}: only the chief ({self.config.chief_task}) rebuilds a ps, so only its "
                             "session watches them; call watch_ps() on the chief")
        if self._watch is not None and self._watch.state is not WatchState.CLOSED:
            raise TrainError(f"{self.task} already watches its ps tasks; close that watch first")
        client = PsClient(self.config.ps_addresses, self._secret, timeout_s=self.request_timeout_s,
                          security=self._security)
        self._watch = PsWatch(self.task, client, self._watched_ps_lost, recovery_timeout_s=self.ps_recovery_timeout_s,
                              every_s=every_s, serialize=self._recovering, retired=self._retired_ps)
        return self._watch.start()

    def save_checkpoint(self, export: bool = False) -> Path:
        """Snapshot every ps (values, optimizer state, step) and write a checkpoint to the
        model directory (chief only). Returns its path. Blocks; other workers keep training."""
        self._require(SessionState.STARTED, "save_checkpoint")
        if self.checkpointer is None:
            raise TrainError(f"{self.task}: only the chief with a model_dir saves checkpoints; "
                             "pass model_dir (--model_dir) to the chief's session")
        if self._overlap is not None:
            self._overlap.settle()
        return self._rehomed_retry(lambda: self.checkpointer.save(self.ps, export=export))

    def checkpoint_if_due(self) -> bool:
        """For a chief that never pushes (a coordinator, docs/coordinator.md): learn the global
        step from ps 0 and save a periodic checkpoint if one is due (CheckpointOptions), as
        `push` does for a chief that trains; `global_step` then follows the ps. Returns whether
        one was due. Does nothing without a checkpointer (not the chief, or no model_dir), and
        logs and returns False if ps 0 does not answer (its recovery is the pushing workers').
        Blocks: one status round trip, plus the save when due. Not thread-safe."""
        self._require(SessionState.STARTED, "checkpoint_if_due")
        if self.checkpointer is None:
            self.stop_if_terminated()
            return False
        try:
            step = self.ps.status(0, self.request_timeout_s).step
        except WireError as e:
            log.warning("%s could not ask ps:0 for the global step (no periodic checkpoint now): %s", self.task, e)
            return False
        self._step = max(self._step, step)
        due = self.checkpointer.save_if_due(self.ps, step)
        self.stop_if_terminated()
        return due

    def stop_if_terminated(self) -> None:
        """For a task that does not push at this point (a coordinating chief between results, a
        worker serving steps while idle): if the process got SIGTERM, learn the global step from
        ps 0, save the chief's final checkpoint (with a model dir) and raise TrainingTerminated,
        as `push` does at its step boundary. Otherwise return at once. Blocks for the save."""
        if not self._stop.requested:
            return
        try:
            self._step = max(self._step, self.ps.status(0, min(2.0, self.request_timeout_s)).step)
        except WireError as e:
            log.warning("%s could not ask ps:0 for the global step on SIGTERM: %s", self.task, e)
        self._stop.stop(self._step, self._save_on_term if self.checkpointer is not None else None)

    # -- internals -------------------------------------------------------------------------

    def _shard_hyper(self, hyper: Mapping[str, Hyper]) -> dict[str, Hyper]:
        """Shard name -> the Hyper of its variable: the last push's answer again while `hyper`
        equals the last push's (a PyTorch optimizer's param groups change at a scheduler's step
        at most; comparing the same Hyper objects again costs no Python call)."""
        seen, shard_hyper = self._hyper_seen
        if hyper == seen:
            return shard_hyper
        if hyper.keys() != self.params.keys():
            missing, extra = self.params.keys() - hyper.keys(), hyper.keys() - self.params.keys()
            raise TrainError(f"hyper-parameters must name every variable: missing {sorted(missing)[:5]}, "
                             f"unknown {sorted(extra)[:5]}")
        shard_hyper = {s.name: hyper[s.variable] for s in self.placement.shards}
        self._hyper_seen = (dict(hyper), shard_hyper)
        return shard_hyper

    def fail_lost_ps(self) -> None:
        """From now on a lost ps that does not come back within `ps_recovery_timeout_s` fails
        the request that needs it, as with `rehome_lost_ps=False`: in-graph training never moves
        a lost ps's shards (`serve_steps` calls this), so waiting for that would not end. Does
        not block."""
        self._recovery = self._failing_recovery

    def _lost_ps(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        # After SIGTERM a ps that goes away is the job ending, not a ps to wait for.
        self._stop.stop(self._step, None)
        asked = time.monotonic()
        with self._recovering:
            deadline += time.monotonic() - asked  # the watch's recovery held the lock: not this ps's time
            self._recovery.recover(client, ps, deadline, cause)

    def _learn_while_waiting(self, results: list[StatusReply | WireError]) -> bool:
        """wait_for_ps's `learn`: a ps this task waits for was re-homed meanwhile (it never
        answers again): apply the placement changes once every ps that answers reports them
        (`settled_history`). Whether any was applied. Blocks briefly (a status to each ps that
        joined, if any)."""
        known = len(self._book.history)
        history = settled_history(self.ps, results)
        if history is None or len(history) <= known:
            return False
        changed = apply_history(self._book, self.ps, history, self.task)
        if changed is None:
            return False
        log.info("%s learned while it waited at start: %s", self.task, ", ".join(
            f"ps:{c.ps} {'was re-homed' if c.kind is ChangeKind.RETIRE else 'joined'}" for c in history[known:]))
        self._use_learned(known, changed)
        return True

    def _use_learned(self, known: int, placement: Placement) -> None:
        """Take the placement of the changes learned at start (the book's history past `known`):
        heartbeat the ps tasks that joined, and use it."""
        self._growing.learned(self.ps, self._book.history[known:])
        self._use_placement(placement)

    def _wait_for_chief(self, deadline: float) -> list[StatusReply]:
        """Block until the chief initialized every ps, and return their (ready) statuses; a ps
        lost meanwhile is recovered as the session's strategy says, and one re-homed meanwhile
        leaves the placement (then the wait goes on with the others: at most once per ps)."""
        while True:
            try:
                return wait_for_chief(self.ps, self.task, str(self.config.chief_task), deadline,
                                      self.init_timeout_s, on_lost=self._recovery.recover_before_start)
            except PlacementChanged as moved:
                self._use_placement(moved.placement)

    def _retired_ps(self) -> tuple[int, ...]:
        """The cluster indices of the ps tasks re-homed so far (read by the ps watch's thread)."""
        return tuple(self._recovery.retired) if isinstance(self._recovery, Rehoming) else ()

    def _watched_ps_lost(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        if self._stop.requested:  # the job is ending (SIGTERM): its ps go away, none is rebuilt
            log.info("%s: ps:%d went away after SIGTERM; the job is ending, so it stops watching the ps (%s)",
                     self.task, ps, cause)
            if self._watch is not None:
                self._watch.close()
            return
        self._rebuild.recover(client, ps, deadline, cause)  # the watch holds the recovery lock (its `serialize`)

    def _use_placement(self, placement: Placement) -> None:
        """Where every shard lives, from the start or after a lost ps was re-homed (its shard
        names, and so `_targets`, do not change)."""
        self.placement = placement
        self._hyper_seen: tuple[dict[str, Hyper] | None, dict[str, Hyper]] = (None, {})  # `_shard_hyper`'s last
        shards = {sh.name: sh for sh in placement.shards}
        self._push_parts = [(ps, [shards[name] for name in names])
                            for ps, names in placement.push_parts(self._push_part_bytes, self._first_ps)]
        # async: the global step is ps 0's count of pushes, answered to the last part sent to it
        self._step_part = max(k for k, (ps, _) in enumerate(self._push_parts) if ps == 0)
        self._names_on = [[s.name for s in placement.on_ps(i)] for i in range(placement.num_ps)]
        if self._chief is not None:
            self._chief.use_placement(placement)
        if self.checkpointer is not None:
            self.checkpointer.use_placement(placement)

    def _rehomed_retry(self, call: Callable[[], Any]) -> Any:
        """`call()`, once more after the placement changed while it ran (a lost ps was re-homed,
        or shards moved to a ps that joined), with the new placement."""
        try:
            return call()
        except PlacementChanged as moved:
            self._use_placement(moved.placement)
        except ShardsMoved as moved:
            self._use_placement(self._growing.follow(self.ps, moved).placement)
        return call()

    def _save_on_term(self) -> Path:
        assert self.checkpointer is not None
        return self._rehomed_retry(lambda: self.checkpointer.save(self.ps, reason=SaveReason.TERMINATED))

    def _assign(self, answers: list[Answer]) -> None:
        for answer in answers:
            for name, value in answer.tensors.items():
                target = self._targets.get(name)
                if target is None or target.shape != value.shape:
                    raise TrainError(f"a ps sent {name!r} with shape {value.shape}, which this worker does not hold")
                if value is not target:  # not already decoded into place
                    np.copyto(target, value)

    def _check_mode(self, statuses: list[StatusReply]) -> None:
        for i, s in enumerate(statuses):
            if self._elastic_sync and s.training is not None and s.training.mode is Mode.SYNC:
                continue  # the ps's quorum follows its membership; this replica's cluster size is not it
            if s.training != self.training:
                raise TrainError(f"{self.task} was started for {self.training} training but ps:{self.ps.ps_id(i)} "
                                 f"runs {s.training}; start every worker with the same --sync / replicas_to_aggregate")


def _as_sendable(grad: Any, dtype: np.dtype) -> np.ndarray:
    """`grad` as a C-contiguous array of `dtype`: itself when it is one already (the usual
    case, checked without np.require's overhead), else a converted copy."""
    if type(grad) is np.ndarray and grad.dtype == dtype and grad.flags.c_contiguous:
        return grad
    return np.require(grad, dtype=dtype, requirements="C")


def _through_the_socket(config: ClusterConfig) -> str:
    """The start line's note when shared memory is off and some ps is on this machine (blocks on a
    name lookup per ps address): "; tensors to ps:0, ps:1 on this machine go through the socket
    (--wire_shared_memory off)", else ""."""
    here = [f"ps:{i}" for i, address in enumerate(config.ps_addresses) if is_on_this_host(address)]
    if not here:
        return ""
    return f"; tensors to {', '.join(here)} on this machine go through the socket (--wire_shared_memory off)"


def _first_ps(config: ClusterConfig) -> int:
    """The ps this replica sends the first part of a push to (`Placement.push_parts`): its
    replica index, or its task index for a worker added after the start (not in the spec)."""
    try:
        return config.replica_index
    except ClusterError:
        return config.task.index


def _training_mode(sync: bool | SyncOptions, num_replicas: int) -> TrainingMode:
    options = SyncOptions() if sync is True else (sync or None)
    if options is None:
        return ASYNC
    replicas = options.replicas_to_aggregate or num_replicas
    if not 1 <= replicas <= num_replicas:
        raise TrainError(f"replicas_to_aggregate={replicas} must be between 1 and the number of "
                         f"replicas ({num_replicas}: chief + workers)")
    return TrainingMode(Mode.SYNC, replicas)
