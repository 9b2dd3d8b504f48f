"""Re-homing on the ps side (issue 14): taking over the shards of a ps that never came back.

The chief sends `adopt` to each surviving ps with the dead ps's shards the new placement gives
it (shoal/train/rehoming.py), all of one step `r` (the replica's or the checkpoint's). In async
mode they simply join the store. In sync mode this ps's own step `h` may differ from `r` by one,
because the dead ps and this one do not finish a step at the same moment; `place_adopted` puts
the shards where their values are (`Position`):

- JOINED (r == h): they join the current step; the workers' resent gradients of step h for
  them complete it as for any shard.
- AHEAD (r == h + 1): the dead ps had finished step h, this one had not: they count as applied
  for step h (a resent gradient of step h for them is STALE, as it was applied already).
- LAGGING (r == h - 1): this ps finished step r, the dead one had not: they lag one step. They
  catch up with the workers' resent gradients of step r, aggregated on their own (`CatchUp`);
  a pull or push that waits for their step-h values waits until they did.
- JUMPED (any other r): the updates between r and h are lost (the chief logs so); the shards
  join the current step with the values they have.

Pure bookkeeping: no I/O; not thread-safe (the ps's serving thread only).
"""

from __future__ import annotations

from enum import Enum
from typing import Collection, Iterable, Mapping

import numpy as np

from shoal.ps.protocol import Hyper, PushOutcome
from shoal.ps.sync import SyncAggregator


class Position(str, Enum):
    """Where adopted shards stand against the adopting ps's sync step (see module docstring)."""

    JOINED = "joined"
    AHEAD = "ahead"
    LAGGING = "lagging"
    JUMPED = "jumped"


class CatchUp:
    """Adopted shards one step behind their new ps, and the aggregation of their missing step:
    `replicas` distinct tasks' gradients of `step`, averaged, as SyncAggregator does. At most one
    lagging step at a time (a second adoption while one lags joins it). Not thread-safe."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._sync: SyncAggregator | None = None
        self._hyper: dict[str, Hyper] = {}

    @property
    def lagging(self) -> frozenset[str]:
        return frozenset(self._names)

    @property
    def step(self) -> int | None:
        """The step the lagging shards' values are of (None when none lags)."""
        return self._sync.step if self._sync is not None else None

    def start(self, names: Iterable[str], step: int, replicas: int, backups: int = 0) -> None:
        """Shards `names` hold the values of `step` and wait for its gradients (`replicas`, with
        `backups` more live members, as the ps's own step)."""
        if self._sync is None:
            self._sync = SyncAggregator(replicas, step=step, backups=backups)
        self._names.update(names)

    def covers(self, names: Collection[str]) -> bool:
        """Whether every one of `names` lags (a push of exactly lagging shards)."""
        return bool(names) and self._names.issuperset(names)

    def add(self, task: str, step: int, grads: Mapping[str, np.ndarray], hyper: Mapping[str, Hyper] | None,
            empty: bool = False) -> tuple[PushOutcome, dict[str, np.ndarray], dict[str, Hyper] | None]:
        """Count `task`'s gradient of the lagging step for some lagging shards. Returns its
        outcome (as SyncAggregator.add; `empty`: the task had no data for the step), the averaged
        gradients now complete (apply them; those shards no longer lag) and their
        hyper-parameters (None unless every one came with one)."""
        assert self._sync is not None
        outcome = self._sync.add(task, step, grads, empty)
        if hyper is not None:
            self._hyper.update(hyper)
        ready = self._take() if outcome is PushOutcome.APPLIED else {}
        hypers = {n: self._hyper[n] for n in ready} if self._hyper.keys() >= ready.keys() else None
        if not self._names:
            self.give_up()
        return outcome, ready, hypers

    def behind(self, min_step: int, *names: Iterable[str]) -> bool:
        """Whether a reply that needs the values of `min_step` for shards `names` (any number of
        collections) must wait for a lagging shard. Cheap when none lags (every reply asks)."""
        return (self._sync is not None and min_step > self._sync.step
                and any(n in self._names for group in names for n in group))

    def set_quorum(self, replicas: int, live: Collection[str] | None = None) -> None:
        """The membership changed: the lagging step needs `replicas` gradients (fewer: at once;
        `live` as for SyncAggregator.set_quorum)."""
        if self._sync is not None:
            self._sync.set_quorum(replicas, live)

    def complete(self) -> tuple[dict[str, np.ndarray], dict[str, Hyper] | None]:
        """After a smaller quorum: the averaged gradients now complete (as `add` returns them)."""
        if self._sync is None:
            return {}, None
        ready = self._take()
        hypers = {n: self._hyper[n] for n in ready} if self._hyper.keys() >= ready.keys() else None
        if not self._names:
            self.give_up()
        return ready, hypers

    def _take(self) -> dict[str, np.ndarray]:
        """The lagging step's averages now complete; every shard it applied (also one that only
        empty pushes came to: no update) stops lagging."""
        step = self._sync.step
        ready = self._sync.take(self._names)
        self._names = {n for n in self._names if not self._sync.applied((n,), step)}
        return ready

    def give_up(self) -> frozenset[str]:
        """Stop waiting for the lagging step (its gradients will not come: they are lost); the
        shards count as current. Returns the shards that lagged."""
        names = frozenset(self._names)
        self._names, self._sync, self._hyper = set(), None, {}
        return names


def place_adopted(sync: SyncAggregator | None, catch_up: CatchUp, names: Collection[str], step: int) -> Position:
    """Put newly adopted shards `names`, whose values are of `step`, into the sync step of their
    new ps (see the module docstring); async (`sync` None): JOINED."""
    if sync is None or not names or step == sync.step:
        return Position.JOINED
    if step == sync.step + 1:
        sync.mark_applied(names)
        return Position.AHEAD
    if step == sync.step - 1:
        catch_up.start(names, step, sync.replicas, sync.backups)
        return Position.LAGGING
    return Position.JUMPED
