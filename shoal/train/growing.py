"""Growing (issue 14): a ps added to a running job gets shards moved onto it, and every worker
learns the new placement without restarting.

How it goes:

1. The new ps registers with ps 0 (`join`, shoal/ps/joining.py); ps 0 lists it in `status`.
2. The chief (`Growing.check`, from its training loop, at most once per `every_s`) sees a
   registered ps that is neither in its client nor retired, computes the grown placement
   (shoal/train/grow_placement.py), and for each ps that gives shards sends `release`: from then
   on that ps answers any push or pull naming them MOVED (not applied, not counted) and hands
   their values, optimizer slots and step over. The chief builds the new ps from the first
   source with `init` + `ready` at its step (as a ps is rebuilt from a replica) and adds the
   others' with `adopt` (moving: nothing retires; in sync mode shoal/ps/adoption.py aligns a
   step that differs by one). Then it tells every ps the placement history (`place`), and logs
   "ps:2 joined: 3 shards (1.2 MiB) moved to it from ps:0, ps:1 at step 812".
3. A worker whose push or pull is answered MOVED (`ShardsMoved`) waits for ps 0's history to
   show the change (`Growing.follow`), replays it (PsClient.add + grow), and the session sends
   the parts answered MOVED again by the new placement, for the same step (a gradient is applied
   by the old ps before the release, or answered MOVED and sent once to the new one), then
   pulls. A worker started later learns the history at start (placement_history.learn_history).

Calls block (bounded); not thread-safe (the session's thread).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from shoal.ps.client import Answer, PsClient
from shoal.ps.errors import ShardsMoved
from shoal.ps.protocol import (AdoptRequest, ChangeKind, ClosureTag, Hyper, PlacementChange, PlaceRequest, ReleaseRequest,
                               ReleaseState, StatusReply, UsedPositions)
from shoal.train.chief import ChiefDuties
from shoal.train.errors import TrainError
from shoal.train.grow_placement import grow, moved_from
from shoal.train.placement import Placement
from shoal.train.placement_history import PlacementBook, PlacementChanged, job_history, shard_homes
from shoal.train.waiting import log_waiting, poll_until
from shoal.wire import WireError
from shoal.wording import byte_size, counted

log = logging.getLogger("shoal.train.session")

DEFAULT_EVERY_S = 1.0
RELEASE_RETRY_S = 10.0
"""How long the chief asks again a ps that cannot release shards mid-step (sync mode)."""


class ReleaseBusyError(TrainError):
    """A ps kept answering a `release` BUSY (sync: mid-step for those shards) for longer than the
    chief asks again."""


class PsGrown(PlacementChanged):
    """Raised (or returned by `Growing.follow`) once a ps joined and shards moved onto it:
    `placement` is where every shard lives now, `joined` the changes applied."""

    def __init__(self, message: str, old: Placement, placement: Placement, joined: Sequence[PlacementChange]):
        super().__init__(message, old, placement)
        self.joined = tuple(joined)


class Growing:
    """The session's part that grows the placement (see module docstring). `chief` is the chief's
    duties on the chief (which grows), None elsewhere. `on_joined(address)` is told each ps that
    joined (the session's heartbeats add it). `wait_s` bounds how long a worker waits for the
    chief's history after a MOVED answer. The constructor does no I/O."""

    def __init__(self, task: str, chief_task: str, book: PlacementBook, chief: ChiefDuties | None, *,
                 on_joined: Callable[[str], None], wait_s: float, every_s: float = DEFAULT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self._task = task
        self._chief_task = chief_task
        self._book = book
        self._chief = chief
        self._on_joined = on_joined
        self._wait_s = wait_s
        self._every_s = every_s
        self._clock = clock
        self._next_check = clock() + every_s
        self._idle: set[int] = set()  # registered ps that no shard would move to (logged once)

    # --- the chief ---------------------------------------------------------------------------

    def check(self, client: PsClient) -> Placement | None:
        """Chief: at most once per `every_s`, ask ps 0 which ps tasks registered; move shards onto
        one that is new (one per call). Returns the new placement, or None. Blocks: one status
        round trip, plus the move when there is one. Raises TrainError if a move fails half-way
        (the job cannot go on with shards nowhere)."""
        if self._chief is None or self._clock() < self._next_check:
            return None
        self._next_check = self._clock() + self._every_s
        try:
            registered = client.status(0, min(client.timeout_s, 5.0)).joined
        except WireError as e:
            log.debug("%s: could not ask ps:0 which ps registered: %s", self._task, e)
            return None
        known = {client.ps_id(k) for k in range(client.num_ps)} | set(self._book.retired)
        for ps in registered:
            if ps.index in known or ps.index in self._idle:
                continue
            return self._grow(client, ps.index, ps.address)
        return None

    def _grow(self, client: PsClient, index: int, address: str) -> Placement | None:
        assert self._chief is not None
        name = f"ps:{index}"
        old = self._book.placement
        moves = moved_from(old, grow(old))
        if not moves:
            self._idle.add(index)
            log.warning("%s: %s joined at %s, but no shard moving onto it would lower the largest ps's load; it "
                        "stays out of the placement", self._task, name, address)
            return None
        try:
            statuses = [client.status(k, min(client.timeout_s, 5.0)) for k in range(client.num_ps)]
        except WireError as e:  # a ps of the job is lost: its recovery comes first, the move later
            log.info("%s: not moving shards onto %s yet: %s", self._task, name, e)
            return None
        done = tuple(sorted({t for s in statuses for t in s.done}))
        members = tuple(sorted({t for s in statuses for t in s.members}))
        new = self._book.join(client, index, address)
        k = client.num_ps - 1
        try:
            status = client.status(k, min(client.timeout_s, 10.0))
        except WireError as e:  # registered, then gone or stalled: nothing moved yet, try again later
            self._book.undo_join(client, old)
            log.warning("%s: %s registered at %s but does not answer (%s); no shard moves onto it until it does",
                        self._task, name, address, e)
            return None
        try:
            if status.shards:
                raise TrainError(f"{self._task}: {name} at {address} joined but holds {status.shards} shards "
                                 "already; start a fresh ps process to add one")
            steps, nbytes = [], 0
            for src, names in moves.items():
                answer = release_shards(client, src, ReleaseRequest(tuple(names), index), clock=self._clock)
                nbytes += sum(v.nbytes for n, v in answer.tensors.items() if n in names)
                steps.append(answer.body.step)
                if len(steps) == 1:
                    client.init(k, self._chief.join_request(answer.body.step, done, members), answer.tensors)
                    client.ready(k)
                else:
                    client.adopt(k, AdoptRequest(client.ps_id(src), answer.body.step, tuple(self._book.retired),
                                                 moving=True), answer.tensors)
            history = PlaceRequest(tuple(self._book.history))
            for i in range(client.num_ps):
                client.place(i, history)
            client.set_incarnation(k, client.status(k, min(client.timeout_s, 5.0)).incarnation)
        except (WireError, ReleaseBusyError) as e:
            raise TrainError(f"{self._task}: could not move shards onto {name} at {address} ({e}); the job cannot "
                             "go on with them half-moved (resume from the checkpoint)") from e
        self._on_joined(address)
        count = sum(len(names) for names in moves.values())
        log.info("%s joined: %s (%s) moved to it from %s at step %s", name, counted(count, "shard"),
                 byte_size(nbytes), ", ".join(f"ps:{client.ps_id(src)}" for src in moves),
                 "/".join(str(s) for s in sorted(set(steps))))
        return new

    # --- every worker ------------------------------------------------------------------------

    def follow(self, client: PsClient, moved: ShardsMoved) -> PsGrown:
        """A request was answered MOVED: wait (up to `wait_s`) for the job's placement history (the
        longest any ps reports) to go beyond this task's, apply it, and return the PsGrown to act on. Blocks; TrainError if
        the chief does not say where the shards went in time."""
        old = self._book.placement
        known = len(self._book.history)

        def probe():  # every ps: one rebuilt after a restart forgets the history, the others keep it
            try:
                statuses = [s for s in client.status_each(1.0) if isinstance(s, StatusReply)]
            except WireError:
                return None
            history = job_history(statuses)
            return history if len(history) > known else None

        def timed_out() -> Exception:
            error = TrainError(f"{self._task}: shards moved ({moved}) but the chief ({self._chief_task}) did not say "
                               f"where within {self._wait_s:g}s; is the chief running?")
            error.__cause__ = moved
            return error

        history = poll_until(probe, deadline=self._clock() + self._wait_s, interval_s=0.05, timed_out=timed_out,
                             waiting=log_waiting(log, f"{self._task} waiting for the chief ({self._chief_task}) to "
                                                 "say where moved shards went", self._wait_s))
        applied = self._book.catch_up(client, history)
        self._learned(client, applied)
        log.info("%s trains on with %s: the shards are on %s now", self._task,
                 ", ".join(f"ps:{c.ps} {c.kind.value}ed" for c in applied),
                 shard_homes(self._book.placement, client.ps_id))
        return PsGrown(f"{self._task}: the placement changed ({moved})", old, self._book.placement, applied)

    def resend(self, client: PsClient, task: str, step: int, moved: ShardsMoved,
               parts: Sequence[tuple[int, Mapping[str, np.ndarray]]], hyper: Mapping[str, Hyper] | None,
               used: UsedPositions | None, into: Mapping[str, np.ndarray], *,
               closure: ClosureTag | None = None, empty: bool = False) -> list[Answer]:
        """A push was answered MOVED: follow the new placement and send the parts answered MOVED
        again by it (`regroup_moved_parts`, `resend_moved_parts`; `empty` as the push was),
        following again if shards moved once more meanwhile. Returns the answers of the parts
        sent. Blocks."""
        while True:
            self.follow(client, moved)
            again, used_again = regroup_moved_parts(self._book.placement, moved, parts, used)
            try:
                return resend_moved_parts(client, task, step, again, hyper, used_again, into, closure=closure,
                                          empty=empty)
            except ShardsMoved as once_more:  # its parts are positions in `again`
                moved, parts, used = once_more, again, used_again

    def learned(self, client: PsClient, applied: Sequence[PlacementChange]) -> None:
        """Changes applied at start: heartbeat the ps tasks that joined."""
        self._learned(client, applied)

    def _learned(self, client: PsClient, applied: Sequence[PlacementChange]) -> None:
        ids = [client.ps_id(k) for k in range(client.num_ps)]
        for change in applied:
            if change.kind is ChangeKind.JOIN:
                self._on_joined(change.address)
                if change.ps in ids:  # this worker's pushes to it name its process (as after start)
                    k = ids.index(change.ps)
                    try:
                        client.set_incarnation(k, client.status(k, min(client.timeout_s, 5.0)).incarnation)
                    except WireError as e:
                        log.debug("%s: no status from ps:%d after it joined: %s", self._task, change.ps, e)


def release_shards(client: PsClient, src: int, request: ReleaseRequest, *, retry_s: float = RELEASE_RETRY_S,
                   clock: Callable[[], float] = time.monotonic) -> Answer:
    """`release` to ps `src` (its position in `client`), asked again while the ps answers BUSY
    (sync: it is mid-step for those shards) for up to `retry_s`: the reply's `state` decides, not
    its text. Returns the RELEASED answer (ReleaseReply and the shards' values and slots). Raises
    WireError as the client does (an error reply is never asked again), ReleaseBusyError naming
    the ps and its last reason once `retry_s` passed. Blocks; not thread-safe (the client's)."""
    deadline = clock() + retry_s
    while True:
        answer = client.release(src, request)
        if answer.body.state is ReleaseState.RELEASED:
            return answer
        if clock() > deadline:
            raise ReleaseBusyError(f"ps:{client.ps_id(src)} still cannot release {list(request.names)[:5]} after "
                                   f"{retry_s:g}s of asking: {answer.body.reason}")
        time.sleep(0.01)


def regroup_moved_parts(placement: Placement, moved: ShardsMoved,
                        parts: Sequence[tuple[int, Mapping[str, np.ndarray]]], used: UsedPositions | None
                        ) -> tuple[list[tuple[int, dict[str, np.ndarray]]], UsedPositions | None]:
    """The push parts answered MOVED (`moved.parts`, positions in `parts`), whole, regrouped by
    `placement` (the grown one) as (ps, gradients), and the `used` positions to send with them:
    `used` travels again only if ps 0's last part was among them (ps 0 did not count it) and a
    part goes to ps 0 again. A shard the old ps had counted before it released the rest is
    answered `duplicate` there; the moved ones are counted once by their new ps. Pure."""
    home = {s.name: s.ps for s in placement.shards}
    again: dict[int, dict[str, np.ndarray]] = {}
    for k in moved.parts:
        for name, grad in parts[k][1].items():
            again.setdefault(home[name], {})[name] = grad
    last_to_ps0 = max((k for k, (ps, _) in enumerate(parts) if ps == 0), default=None)
    used = used if last_to_ps0 in moved.parts and 0 in again else None
    return sorted(again.items()), used


def resend_moved_parts(client: PsClient, task: str, step: int, again: Sequence[tuple[int, Mapping[str, np.ndarray]]],
                       hyper: Mapping[str, Hyper] | None, used: UsedPositions | None, into: Mapping[str, np.ndarray],
                       *, closure: ClosureTag | None = None, empty: bool = False) -> list[Answer]:
    """Send the parts `regroup_moved_parts` made (`again`, with its `used`) for `step` (`empty`:
    zeros standing for no data, PushRequest.empty). Blocks; raises ShardsMoved if shards moved
    again meanwhile (`Growing.resend` follows and retries)."""
    if not again:
        return []
    return client.push_all(task, step, again, into,
                           {n: hyper[n] for _, grads in again for n in grads} if hyper is not None else None, used,
                           closure=closure, empty=empty)
