"""The placement as a history of changes (issue 14): replayed in order from the job's initial
placement, the ps tasks re-homed (`rehome`) and joined (`grow`) give every task the same
placement and the same numbering of its ps, whenever it started.

`PlacementBook` holds one task's current placement and the history it applied, and applies a
change to it and to the task's PsClient together (`drop` for a retirement, `add` for a join), so
the placement's ps k is always the client's ps k. `replay` is the pure part.

Not thread-safe (the session's thread).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

from shoal.ps.client import PsClient
from shoal.ps.protocol import ChangeKind, PlacementChange, StatusReply
from shoal.train.errors import TrainError
from shoal.train.grow_placement import grow
from shoal.train.placement import Placement
from shoal.train.recovery import missing_ps
from shoal.train.rehome_placement import rehome
from shoal.train.waiting import LOG_EVERY_S, log_waiting, poll_until
from shoal.wording import counted

log = logging.getLogger("shoal.train.session")


class PlacementChanged(TrainError):
    """Raised out of a request while the job's placement changed (a ps re-homed: PsRehomed, or
    shards moved to a ps that joined: PsGrown): `placement` is where every shard lives now,
    `old` where they lived. The request was given up; the caller adopts the placement and does
    again what the request did."""

    def __init__(self, message: str, old: Placement, placement: Placement):
        super().__init__(message)
        self.old = old
        self.placement = placement


def replay(placement: Placement, ids: Sequence[int], history: Sequence[PlacementChange]) -> tuple[Placement, list[int]]:
    """The placement and the cluster index of each of its ps after `history`, from `placement`
    whose ps k is cluster ps `ids[k]`. Pure."""
    ids = list(ids)
    for change in history:
        if change.kind is ChangeKind.RETIRE:
            if change.ps not in ids:
                raise TrainError(f"the placement history retires ps:{change.ps}, which is not in the placement "
                                 f"(ps {ids}); every task must start from the same cluster")
            k = ids.index(change.ps)
            placement = rehome(placement, k)
            del ids[k]
        else:
            if change.ps in ids:
                raise TrainError(f"ps:{change.ps} joins the placement, which has it already (ps {ids}); a ps "
                                 "added to a running job takes an index above the highest that ever ran")
            placement = grow(placement)
            ids.append(change.ps)
    return placement, ids


class PlacementBook:
    """One task's placement and the history of changes it applied (see module docstring)."""

    def __init__(self, placement: Placement, on_retired: Callable[[str], None] | None = None):
        """`on_retired(address)`: told the address of each ps this task retires (its heartbeats
        stop going there)."""
        self.placement = placement
        self.history: list[PlacementChange] = []
        self._on_retired = on_retired

    @property
    def retired(self) -> list[int]:
        """The ps tasks re-homed so far, in that order."""
        return [c.ps for c in self.history if c.kind is ChangeKind.RETIRE]

    def retire(self, client: PsClient, ps: int) -> Placement:
        """Client ps `ps` was re-homed: drop it; returns the new placement."""
        change = PlacementChange(ChangeKind.RETIRE, client.ps_id(ps))
        address = client.addresses[ps]
        self.placement = rehome(self.placement, ps)
        client.drop(ps)
        self.history.append(change)
        if self._on_retired is not None:
            self._on_retired(address)
        return self.placement

    def join(self, client: PsClient, cluster_id: int, address: str) -> Placement:
        """ps `cluster_id` at `address` joined: add it to the client; returns the new placement."""
        self.placement = grow(self.placement)
        client.add(address, cluster_id)
        self.history.append(PlacementChange(ChangeKind.JOIN, cluster_id, address))
        return self.placement

    def undo_join(self, client: PsClient, before: Placement) -> None:
        """Take back the last change, a join nothing has moved onto yet (the ps that joined did
        not answer): the client drops it and the placement is `before` again."""
        change = self.history.pop()
        if change.kind is not ChangeKind.JOIN:
            self.history.append(change)
            raise TrainError(f"cannot undo {change.fields()}: only a join that moved nothing is undone")
        client.drop(client.num_ps - 1)
        self.placement = before

    def catch_up(self, client: PsClient, history: Sequence[PlacementChange]) -> list[PlacementChange]:
        """Apply the changes of `history` (the job's, as a ps reports it) this task has not applied
        yet. Returns them. Raises TrainError if this task's history is not a prefix of it."""
        known = len(self.history)
        if tuple(history[:known]) != tuple(self.history):
            raise TrainError(f"this task's placement history {[c.fields() for c in self.history]} differs from the "
                             f"job's {[c.fields() for c in history]}; restart the task")
        new = list(history[known:])
        for change in new:
            if change.kind is ChangeKind.RETIRE:
                ids = [client.ps_id(k) for k in range(client.num_ps)]
                if change.ps not in ids:
                    raise TrainError(f"the job's placement history retires ps:{change.ps}, which this task does not "
                                     f"talk to (ps {ids})")
                self.retire(client, ids.index(change.ps))
            else:
                self.join(client, change.ps, change.address)
        return new


def job_history(statuses: Sequence[StatusReply]) -> tuple[PlacementChange, ...]:
    """The job's placement history as the ps tasks that answered report it: the longest one (a
    ps re-homed before `place` existed reports only `retired`: read as retirements)."""
    longest = max((s.history for s in statuses), key=len, default=())
    if longest:
        return tuple(longest)
    retired = max((s.retired for s in statuses), key=len, default=())
    return tuple(PlacementChange(ChangeKind.RETIRE, i) for i in retired)


def settled_history(client: PsClient, results: Sequence[StatusReply | Exception]) -> tuple[PlacementChange, ...] | None:
    """From one poll of every ps (`results`: a StatusReply, or the error of one that did not
    answer), the job's placement history once it is settled: the longest one reported, if every
    ps it does not retire answered with that very history (each survivor has adopted its part
    of a retired ps's shards: the chief hands them out one survivor after another). A ps it
    retires may be gone, or a process started again at its address (it exits once ps 0 tells it
    so): it is not asked. None otherwise."""
    reported = {k: job_history([r]) for k, r in enumerate(results) if isinstance(r, StatusReply)}
    if not reported:
        return None
    longest = max(reported.values(), key=len)
    retired = {c.ps for c in longest if c.kind is ChangeKind.RETIRE}
    if any(reported.get(k) != longest for k in range(len(results)) if client.ps_id(k) not in retired):
        return None
    return longest


SETTLE_S = 5.0
"""How long `learn_history` waits, once a ps answered, for the placement history to settle
(`settled_history`) before it takes the longest one reported as it is (a ps down at the moment,
or one that lost its history in a restart, would keep it from settling)."""


def learn_history(book: PlacementBook, client: PsClient, deadline: float, task: str,
                  total_s: float | None = None) -> Placement | None:
    """At start: apply the placement changes made before this task started (ps tasks re-homed or
    joined), once every ps reports them (`settled_history`: a re-homing may be under way), or
    as the longest history reported SETTLE_S after the first answer; polling up to `deadline`,
    the end of a wait of `total_s`, and logging every 5 s which ps it waits for. Returns the new
    placement, or None if nothing changed. Blocks."""
    missing: list[int] = []
    first_answer: list[float] = []

    def probe() -> tuple[PlacementChange, ...] | None:
        results = client.status_each(0.5)
        missing[:] = [i for i, r in enumerate(results) if not isinstance(r, StatusReply)]
        answered = [s for s in results if isinstance(s, StatusReply)]
        if not answered:
            return None
        settled = settled_history(client, results)
        if settled is not None:
            return settled
        first_answer[:] = first_answer or [time.monotonic()]
        return job_history(answered) if time.monotonic() - first_answer[0] >= SETTLE_S else None

    total_s = total_s if total_s is not None else max(0.0, deadline - time.monotonic())
    try:  # says what it waits for as wait_for_ps does, which takes over once one ps answered
        history = poll_until(probe, deadline=deadline, interval_s=0.1, timed_out=lambda: TrainError("no ps answered"),
                             waiting=log_waiting(log, lambda: f"{task} waiting for {missing_ps(client, missing)}",
                                                 total_s, deadline),
                             log_every_s=LOG_EVERY_S)
    except TrainError:
        return None  # waiting for the ps at start says who is missing
    return apply_history(book, client, history, task)


def apply_history(book: PlacementBook, client: PsClient, history: Sequence[PlacementChange],
                  task: str) -> Placement | None:
    """Apply (and log) the changes of the job's placement `history` that `book` lacks. Returns
    the new placement, or None if nothing changed. Does not block."""
    new = book.catch_up(client, history)
    if not new:
        return None
    retired = [c.ps for c in new if c.kind is ChangeKind.RETIRE]
    joined = [c.ps for c in new if c.kind is ChangeKind.JOIN]
    where = shard_homes(book.placement, client.ps_id)
    if retired:
        log.info("%s starts without %s (re-homed before it started): the shards are on %s", task,
                 ", ".join(f"ps:{i}" for i in retired), where)
    if joined:
        log.info("%s starts with %s (joined before it started): the shards are on %s", task,
                 ", ".join(f"ps:{i}" for i in joined), where)
    return book.placement


def shard_homes(placement: Placement, ps_id: Callable[[int], int]) -> str:
    """Where `placement`'s shards are, each ps named by the cluster index `ps_id` gives its ps k
    (a PsClient's `ps_id`): "ps:0 (2 shards), ps:2 (1 shard)", then "; ps:1 holds none" for the
    ps holding no shard (a small model sits on one ps). For the log lines of a placement that
    changed. Does not block."""
    held = [(ps_id(k), len(placement.on_ps(k))) for k in range(placement.num_ps)]
    where = ", ".join(f"ps:{ps} ({counted(n, 'shard')})" for ps, n in held if n)
    empty = [f"ps:{ps}" for ps, n in held if not n]
    if empty:
        where += f"; {', '.join(empty)} {'holds' if len(empty) == 1 else 'hold'} none"
    return where
