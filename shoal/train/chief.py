"""`ChiefDuties`: what only the chief does to the parameter servers: initialize them once (from
the newest checkpoint when there is one) and rebuild a ps task that restarted.

A part of TrainingSession. Calls block on the network (bounded by the client's timeouts); not
thread-safe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from shoal.ps.client import PsClient
from shoal.ps.optimizers import UpdateRule
from shoal.ps.protocol import InitRequest, Mode, PlaceRequest, PlacementChange, TrainingMode
from shoal.train.checkpointer import Checkpointer
from shoal.train.local_state import LocalState
from shoal.train.placement import Placement
from shoal.train.replica_source import Replica, fetch_replica
from shoal.train.snapshot import check_fits, scatter
from shoal.wire import WireError
from shoal.wording import counted

log = logging.getLogger("shoal.train.session")


@dataclass(frozen=True)
class ShardSource:
    """The shards of a lost ps as the chief can recreate them: tensors (values and
    "<shard>@<slot>"), the step they are of, where they come from ("ps:0's replica at step 412")
    and, when not from a replica, why not (for the warning that updates were lost)."""

    tensors: Mapping[str, np.ndarray]
    step: int
    source: str
    why_not_replica: str = ""


class ChiefDuties:
    """Initializes or restores the ps tasks and rebuilds a restarted one.

    `params` is the chief's own copy of the variables (the source when there is no checkpoint);
    `checkpoints` is None without a model dir; `current_step()` is the chief's global step.
    `local_state` (the chief's buffers), if any, is in every checkpoint and is restored from the
    one that initializes the job (not when a ps is rebuilt: the chief's own values are newer).
    `history()` is the chief's placement history (its PlacementBook's): the replica ring follows
    it (shoal/ps/ring.py), so a lost ps's replica is asked of its successor by that history.
    `params_step()` is the step of the values in `params` (the chief's copy), as last pulled: a
    coordinating chief never pushes, so its copy may be far older than `current_step()`.
    """

    def __init__(self, task: str, placement: Placement, params: Mapping[str, np.ndarray], optimizer: UpdateRule,
                 training: TrainingMode, checkpoints: Checkpointer | None, current_step: Callable[[], int],
                 local_state: LocalState | None = None,
                 history: Callable[[], Sequence[PlacementChange]] = tuple,
                 params_step: Callable[[], int] | None = None):
        self._task = task
        self._placement = placement
        self._params = params
        self._optimizer = optimizer
        self._training = training
        self._checkpoints = checkpoints
        self._current_step = current_step
        self._local_state = local_state
        self._history = history
        self._params_step = params_step or current_step

    @property
    def placement(self) -> Placement:
        return self._placement

    def use_placement(self, placement: Placement) -> None:
        """Place shards by `placement` from now on (the job re-homed a ps: shoal/train/rehoming.py)."""
        self._placement = placement

    def _newest_source(self, client: PsClient, ps: int):
        """ps `ps`'s replica from its successor unless the newest checkpoint is newer: (replica or
        None, why there is none to use, the newest checkpoint or None). Blocks on one replica
        request."""
        replica, why_not = fetch_replica(client, self._placement, self._params, ps, self._optimizer, self._training,
                                         timeout_s=min(client.timeout_s, 30.0), history=self._history())
        checkpoint = self._checkpoints.latest() if self._checkpoints is not None else None
        if replica is not None and checkpoint is not None and checkpoint.step > replica.step:
            why_not = (f"the replica ps:{client.ps_id(replica.holder)} holds is of step {replica.step}, older than "
                       f"checkpoint step {checkpoint.step}")
            replica = None
        return replica, why_not, checkpoint

    def lost_shards(self, client: PsClient, ps: int) -> ShardSource:
        """ps `ps`'s shards, to re-home them: from the replica its successor holds unless the
        newest checkpoint is newer; else from the newest checkpoint; else from the chief's copy
        (its optimizer state fresh). Blocks on one replica request and reading a checkpoint."""
        replica, why_not, checkpoint = self._newest_source(client, ps)
        if replica is not None:
            return ShardSource(replica.tensors, replica.step,
                               f"ps:{client.ps_id(replica.holder)}'s replica at step {replica.step}")
        values, slots, saved_step, _ = self._restore_source(f"for ps:{client.ps_id(ps)}, which did not come back",
                                                            checkpoint)
        tensors = scatter(self._placement, values, slots, only_ps=ps)[ps]
        if saved_step is None:
            return ShardSource(tensors, self._current_step(), f"{self._copy()} (optimizer state fresh)", why_not)
        return ShardSource(tensors, saved_step, f"checkpoint step {saved_step}", why_not)

    def initialize(self, client: PsClient) -> None:
        """Create every shard on every ps (from the newest checkpoint if any), then mark them
        ready so the other workers start."""
        values, slots, step, leases = self._restore_source("initializing the job")
        tensors = scatter(self._placement, values, slots)
        replies = client.init_all(self._init_request(step or 0, leases=leases), tensors)
        client.ready_all()
        if step is not None and self._local_state is not None:
            self._local_state.restore({name: values[name] for name in self._local_state.values()})
        holding = sum(1 for r in replies if r.created)
        on = f"{client.num_ps} ps" if holding == client.num_ps else f"{holding} of {client.num_ps} ps"
        log.info("%s initialized %s (%s) on %s", self._task, counted(len(self._params), "variable"),
                 counted(sum(r.created for r in replies), "shard"), on)

    def rebuild_ps(self, client: PsClient, ps: int) -> None:
        """Rebuild a restarted ps (`_rebuild`), then tell it the placement history, which it forgot
        in the restart: it replicates by the ring that history makes (shoal/ps/ring.py). Blocks."""
        self._rebuild(client, ps)
        history = tuple(self._history())
        if not history:
            return
        try:
            client.place(ps, PlaceRequest(history))
        except WireError as e:  # it serves its shards; only its replication waits for the next rebuild
            log.warning("%s: could not tell the rebuilt ps:%d the placement history (%s); it sends no replicas "
                        "until it learns it", self._task, client.ps_id(ps), e)

    def _rebuild(self, client: PsClient, ps: int) -> None:
        """Recreate a restarted ps's shards from the replica its successor holds (values, slots,
        step; issue 14) unless the newest checkpoint is newer; else from the newest checkpoint
        (else the chief's copy), warning what was lost. Logs which source was used and its step.

        The step it restarts at: in sync mode the newest of the other ps tasks', the source's and
        the chief's, so pushes for steps the restored values already hold are STALE (never
        applied twice); in async mode the replica's own step (the count of pushes its values
        hold), and pushes computed before the restart are dropped by their `basis`."""
        others = []
        for i in range(client.num_ps):
            if i != ps:
                try:  # over the second connection: a push may still wait on the main one
                    others.append(client.probe_status(i, timeout_s=2.0))
                except WireError:
                    pass
        done = tuple(sorted({t for s in others for t in s.done}))
        # the replicas still training, as the other ps count them (None: no other ps answered)
        members = tuple(sorted({t for s in others for t in s.members})) if others else None
        if ps != 0 and not self._placement.on_ps(ps):  # ps 0 also holds the lease book
            log.info("%s: ps:%d holds no variables; restarting it at step %d", self._task, client.ps_id(ps),
                     max([s.step for s in others] + [self._current_step()]))
            client.init(ps, self._init_request(max([s.step for s in others] + [self._current_step()]), done,
                                               members=members), {})
            client.ready(ps)
            return
        replica, why_not, checkpoint = self._newest_source(client, ps)
        if replica is not None:
            self._rebuild_from_replica(client, ps, replica, others, done, members)
            return
        values, slots, saved_step, leases = self._restore_source(f"for ps:{ps}, which restarted", checkpoint)
        if saved_step is None:
            log.warning("%s: no checkpoint in model_dir; rebuilding ps:%d from this task's copy of its variables "
                        "(its optimizer state starts fresh)", self._task, ps)
        log.warning("%s: no usable replica of ps:%d: %s; rebuilding it from %s: every update to its shards since "
                    "then is lost", self._task, ps, why_not,
                    f"checkpoint step {saved_step}" if saved_step is not None else self._copy())
        step = max([s.step for s in others] + [saved_step or 0, self._current_step()])
        client.init(ps, self._init_request(step, done, leases if ps == 0 else None, members),
                    scatter(self._placement, values, slots, only_ps=ps)[ps])
        client.ready(ps)
        log.info("%s rebuilt ps:%d at step %d", self._task, ps, step)

    def _copy(self) -> str:
        """The chief's copy of the variables, named with its step: "the chief's copy of its
        variables (step 0, as it last pulled them)"."""
        return f"the chief's copy of its variables (step {self._params_step()}, as it last pulled them)"

    def _rebuild_from_replica(self, client: PsClient, ps: int, replica: Replica, others, done, members) -> None:
        if self._training.mode is Mode.SYNC:
            step = max([s.step for s in others] + [replica.step, self._current_step()])
        else:
            step = replica.step
        leases = replica.reply.leases if ps == 0 else None
        client.init(ps, self._init_request(step, done, leases, members), replica.tensors)
        client.ready(ps)
        log.info("%s rebuilt ps:%d from the replica ps:%d holds: step %d (%d tensors, %.1f kB, replicated %.1fs "
                 "before the rebuild), at step %d", self._task, client.ps_id(ps), client.ps_id(replica.holder),
                 replica.step, len(replica.tensors), replica.nbytes / 1e3, replica.reply.age_ms / 1000, step)

    def join_request(self, step: int, done: tuple[str, ...], members: tuple[str, ...]) -> InitRequest:
        """The `init` of a ps that joined the running job (shoal/train/growing.py): this job's
        rule and mode, at `step`, following the other ps tasks' membership."""
        return self._init_request(step, done, None, members)

    def _init_request(self, step: int, done: tuple[str, ...] = (), leases: dict | None = None,
                      members: tuple[str, ...] | None = None) -> InitRequest:
        return InitRequest(self._optimizer.to_config(), self._training, step, done, leases, members)

    def _restore_source(self, what: str, checkpoint=None) -> tuple[Mapping[str, np.ndarray], dict, int | None, dict | None]:
        """Values, optimizer slots, step and lease book state to (re)create shards from:
        `checkpoint` if given, else the newest valid checkpoint, else this task's own variables
        (with fresh slots, no step and no lease book)."""
        if checkpoint is None and self._checkpoints is not None:
            checkpoint = self._checkpoints.latest()
        if checkpoint is None:
            return self._params, {}, None, None
        local = self._local_state.values() if self._local_state is not None else {}
        check_fits({**self._params, **local}, checkpoint.variables, str(checkpoint.path))
        slots = checkpoint.slots
        if checkpoint.optimizer.get("name") != self._optimizer.name:
            log.warning("the checkpoint was trained with %s, this job uses %s: the optimizer state starts fresh",
                        checkpoint.optimizer.get("name"), self._optimizer.name)
            slots = {}
        log.info("restored checkpoint step=%d from %s (%s)", checkpoint.step, checkpoint.path, what)
        return checkpoint.variables, slots, checkpoint.step, checkpoint.leases
