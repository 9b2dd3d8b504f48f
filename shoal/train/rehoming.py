"""Re-homing (issue 14): a lost ps that does not come back within its recovery timeout leaves
the job; its shards move to the surviving ps tasks and training goes on with one ps fewer.

`Rehoming` is the session's `on_lost` handler (the PsClient's seam for a lost ps). It wraps
`PsRecovery`, which still brings back a ps that returns in time:

- On the chief it waits for the ps as PsRecovery does (rebuilding it if it comes back). If the
  ps is still gone at the deadline, it takes the ps's shards from where PsRecovery would have
  rebuilt them (`ChiefDuties.lost_shards`: the successor's replica unless the newest checkpoint
  is newer, else that checkpoint, else the chief's copy), computes the new placement
  (shoal/train/rehome_placement.py) and sends each survivor its part with `adopt` (values,
  optimizer slots, their step; shoal/ps/adoption.py), which also tells it the ps is retired.
- On other workers it waits for the ps to come back (then PsRecovery takes over) or for every
  survivor's `status` to name it retired, for up to twice the recovery timeout (the chief may
  notice the loss later than they do) plus MOVE_GRACE_S.

Either way, once the ps is re-homed the handler drops it from the PsClient, computes the same new
placement every task computes, and raises `PsRehomed`: the request in flight is given up, and
the session adopts the placement and finishes what it was doing (TrainingSession: a sync push
resends the gradients of the moved shards for the step in flight, then pulls).

Every wait is bounded; calls block; not thread-safe (the session's thread).
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from typing import Callable, Mapping

import numpy as np

from shoal.ps.client import PsClient
from shoal.ps.protocol import SLOT_SEPARATOR, AdoptRequest, ClosureTag, Hyper
from shoal.train.chief import ChiefDuties
from shoal.train.errors import TrainError
from shoal.train.placement import Placement
from shoal.train.placement_history import PlacementBook, PlacementChanged, learn_history, shard_homes
from shoal.train.recovery import PsRecovery
from shoal.train.rehome_placement import moved_to, rehome
from shoal.train.waiting import log_waiting, poll_until
from shoal.wire import WireError
from shoal.wording import counted

log = logging.getLogger("shoal.train.session")

MOVE_GRACE_S = 30.0
"""How much longer than twice the recovery timeout a worker other than the chief waits for a lost
ps's shards to move: the chief's last probes of the ps, reading a replica or a checkpoint, and
sending the shards to the survivors."""


class LostPs(Enum):
    """What became of a lost ps a worker other than the chief waited for."""

    BACK = "back"        # it answers again (restarted)
    RETIRED = "retired"  # the chief moved its shards: every other ps says it was re-homed


class PsRehomed(PlacementChanged):
    """Raised out of a request while a lost ps was re-homed: the client no longer talks to it,
    and `placement` is where every shard lives now (`moved`: the shards that moved, by the ps
    of `placement` that holds them). The request was given up; the caller adopts the placement
    and does again what the request did."""

    def __init__(self, message: str, ps: int, old: Placement, placement: Placement):
        super().__init__(message, old, placement)
        self.ps = ps
        self.moved = moved_to(old, placement, ps)


class Rehoming:
    """The `on_lost` handler that re-homes a ps that does not come back (see module docstring).
    `chief` (the chief's duties) on the chief, None on other workers. `placement` is the job's
    placement at the start, or the task's PlacementBook (shared with the session's other parts
    that change the placement: shoal/train/growing.py); `placement` (the attribute) is the
    current one."""

    def __init__(self, task: str, chief_task: str, timeout_s: float, recovery: PsRecovery,
                 placement: Placement | PlacementBook, chief: ChiefDuties | None, *,
                 clock: Callable[[], float] = time.monotonic):
        self._task = task
        self._chief_task = chief_task
        self._timeout_s = timeout_s
        self._recovery = recovery
        self._chief = chief
        self._clock = clock
        self.book = placement if isinstance(placement, PlacementBook) else PlacementBook(placement)

    @property
    def placement(self) -> Placement:
        return self.book.placement

    @property
    def retired(self) -> list[int]:
        """Cluster indices of the ps tasks re-homed so far, in that order."""
        return self.book.retired

    def recover(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        """The PsClient's `on_lost`: return once ps `ps` serves again, or raise PsRehomed once
        its shards moved; TrainError if neither happens in time."""
        if client.ps_id(ps) == 0:  # ps 0 holds the lease book and the async global step: it is never re-homed
            self._recovery.recover(client, ps, deadline, cause)
            return
        if client.num_ps > 1 and self._retired_everywhere(client, ps):
            self._leave(client, ps)
        if self._chief is None:
            self._wait(client, ps, deadline, cause)
            return
        try:
            self._recovery.recover(client, ps, deadline, cause)
        except TrainError:
            if client.num_ps < 2 or self._answers(client, ps):
                raise  # the job's only ps, or it came back and could not be restored
            self._move(client, ps)

    def learn(self, client: PsClient, deadline: float) -> Placement | None:
        """At start: the placement changes made before this worker started (ps tasks re-homed or
        joined), as the first ps tasks to answer `status` report them (polling until one does,
        up to `deadline`); see `learn_history`. Returns the new placement, or None if none
        changed. Blocks."""
        return learn_history(self.book, client, deadline, self._task)

    # --- the chief ---------------------------------------------------------------------------

    def _move(self, client: PsClient, ps: int) -> None:
        assert self._chief is not None
        name = f"ps:{client.ps_id(ps)}"
        source = self._chief.lost_shards(client, ps)
        new = rehome(self.placement, ps)
        moved = moved_to(self.placement, new, ps)
        request = AdoptRequest(client.ps_id(ps), source.step, (*self.retired, client.ps_id(ps)))
        homes = []
        for j in range(new.num_ps):
            k = j if j < ps else j + 1  # the survivor's index in the client before the drop
            names = set(moved.get(j, ()))
            tensors = {t: v for t, v in source.tensors.items() if t.partition(SLOT_SEPARATOR)[0] in names}
            try:
                reply = client.adopt(k, request, tensors)
            except WireError as e:
                raise TrainError(f"{self._task}: could not move {name}'s shards to ps:{client.ps_id(k)} ({e}); "
                                 "the job cannot go on without them (restart the ps tasks, or resume from the "
                                 "checkpoint)") from e
            if names:
                homes.append((f"ps:{client.ps_id(k)}", len(names), reply.step))
        where = (homes[0][0] if len(homes) == 1 else
                 ", ".join(f"{home} ({count})" for home, count, _ in homes) or "no ps (it held none)")
        count = len(self.placement.on_ps(ps))
        log.warning("%s: %s did not come back within %gs: its %s moved to %s (from %s; %s)", self._task,
                    name, self._timeout_s, counted(count, "shard"), where, source.source,
                    ", ".join(f"{home} at step {step}" for home, _, step in homes) or "nothing to move")
        if source.why_not_replica and count:  # (a ps that held nothing lost nothing)
            log.warning("%s: no usable replica of %s: %s; every update to its shards since %s is lost", self._task,
                        name, source.why_not_replica, source.source)
        self._leave(client, ps)

    def _answers(self, client: PsClient, ps: int) -> bool:
        try:
            client.status(ps, 1.0)
            return True
        except WireError:
            return False

    # --- other workers -----------------------------------------------------------------------

    def recover_before_start(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        """`wait_for_chief`'s `on_lost` (a worker lost ps `ps` before it trains): return once the
        ps answers again, ready or not (the wait for the chief goes on), raise PsRehomed once the
        chief moved its shards, TrainError if neither happens in time (PsRecovery's wait for
        ps 0 or the only ps; twice the recovery timeout plus MOVE_GRACE_S for another)."""
        if client.ps_id(ps) == 0 or client.num_ps < 2:
            self._recovery.recover_before_start(client, ps, deadline, cause)
            return
        if self._back_or_retired(client, ps, deadline + self._timeout_s + MOVE_GRACE_S, cause) is LostPs.RETIRED:
            self._leave(client, ps)

    def _wait(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        """Wait for ps `ps` to come back (PsRecovery then waits for the chief to restore it) or
        for the chief to re-home it — also while PsRecovery waits: a process started at the ps's
        address after the chief moved its shards answers, but is never restored."""
        if client.num_ps < 2:
            self._recovery.recover(client, ps, deadline, cause)
            return
        deadline += self._timeout_s + MOVE_GRACE_S
        if self._back_or_retired(client, ps, deadline, cause) is LostPs.BACK and self._recovery.recover(
                client, ps, deadline, cause, retired=lambda: self._retired_everywhere(client, ps)):
            return
        self._leave(client, ps)

    def _back_or_retired(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> "LostPs":
        """Poll until ps `ps` answers `status` (BACK) or every other ps says it was re-homed
        (RETIRED); TrainError at `deadline`, which callers give as their recovery deadline plus
        the timeout and MOVE_GRACE_S (the chief may notice the loss later than this worker does).
        Blocks."""
        name, address = f"ps:{client.ps_id(ps)}", client.addresses[ps]
        total_s = self._timeout_s * 2 + MOVE_GRACE_S
        log.warning("%s lost %s at %s (%s); waiting up to %.0fs for it to come back or the chief (%s) to move its "
                    "shards", self._task, name, address, cause, max(0.0, deadline - self._clock()), self._chief_task)

        def probe() -> LostPs | None:
            if self._retired_everywhere(client, ps):
                return LostPs.RETIRED
            try:
                client.status(ps, 1.0)
                return LostPs.BACK
            except WireError:
                return None

        def timed_out() -> Exception:
            error = TrainError(f"{self._task}: {name} at {address} did not come back within {total_s:g}s and the "
                               f"chief ({self._chief_task}) did not move its shards; is the chief running? (raise "
                               "ps_recovery_timeout_s if the ps restarts slowly)")
            error.__cause__ = cause
            return error

        return poll_until(probe, deadline=deadline, interval_s=0.2, timed_out=timed_out,
                          waiting=log_waiting(log, f"{self._task} waiting for {name} at {address} to come back "
                                              f"or the chief ({self._chief_task}) to move its shards", total_s),
                          stop=self._recovery.stop)

    def _retired_everywhere(self, client: PsClient, ps: int) -> bool:
        """Whether every other ps says ps `ps` was re-homed (asked over the second connections:
        a request may still wait on the main ones)."""
        for k in range(client.num_ps):
            if k == ps:
                continue
            try:
                if client.ps_id(ps) not in client.probe_status(k, 1.0).retired:
                    return False
            except WireError:
                return False
        return True

    # --- both --------------------------------------------------------------------------------

    def _leave(self, client: PsClient, ps: int) -> None:
        name = f"ps:{client.ps_id(ps)}"
        old = self.placement
        new = self.book.retire(client, ps)
        survivors = ", ".join(f"ps:{client.ps_id(k)}" for k in range(client.num_ps))
        log.info("%s trains on without %s: the shards are on %s now", self._task, name, shard_homes(new, client.ps_id))
        raise PsRehomed(f"{self._task}: {name} was re-homed to {survivors}", ps, old, new)


def resend_moved(client: PsClient, task: str, step: int, moved: PsRehomed, gradients: Mapping[str, np.ndarray],
                 hyper: Mapping[str, Hyper] | None, into: Mapping[str, np.ndarray], *,
                 closure: ClosureTag | None = None, empty: bool = False) -> None:
    """Sync: send `task`'s gradients (variable -> gradient) of `step`, the step in flight when
    ps `moved.ps` was re-homed, for the shards that moved, to their new ps: what went to the lost
    ps, which may never have counted it. Their new ps counts each task's gradient of a step once
    (shoal/ps/adoption.py: applied already, part of its step, or catching up). `hyper` (shard ->
    Hyper), if given, as the push had it. `closure`, the push's closure tag (coordinator
    closures), if it had one: the new ps's ledger then knows these shards applied for it, so a
    re-run of the closure is answered DUPLICATE, not applied again. `empty`: the gradients are
    zeros standing for no data (PushRequest.empty), as the push's were. Blocks until the new ps
    answered (the step is done there)."""
    shards = {s.name: s for s in moved.placement.shards}
    parts = [(ps, {name: shards[name].rows(gradients[shards[name].variable]) for name in names})
             for ps, names in sorted(moved.moved.items())]
    if parts:
        client.push_all(task, step, parts, into, hyper, closure=closure, empty=empty)
