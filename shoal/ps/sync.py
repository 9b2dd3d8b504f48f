"""Synchronous aggregation: average `replicas` fresh gradients per shard and step, drop stale ones.

`replicas` (the quorum) follows the membership (shoal/ps/membership.py): a quorum that grows
(a member joined) takes effect at the next step (at once if the current one has no gradient
yet); one that shrinks (a member left) at once, so the current step completes without the
member that left. Each shard's update is the average
of the gradients actually summed for it.

A replica with no data for a step (its leases ran out while others finish theirs, at the end of
the epochs asked for) pushes *empty* (`add_empty`): it counts toward the quorum of every shard
of the step and adds nothing to the average, so the others' steps never wait on it. A shard
whose step every counted replica pushed empty is marked applied with no update (no optimizer
step on a zero gradient: momentum or Adam state does not move).

Each shard is aggregated on its own, as TensorFlow's SyncReplicasOptimizer keeps one
accumulator per variable: a shard's update is applied as soon as `replicas` distinct tasks
pushed it for the current step, so a push that travels in parts (one message per group of
shards) is answered part by part. The step advances once every shard of the ps was applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

import numpy as np

from shoal.ps.protocol import PushOutcome


@dataclass
class SyncAggregator:
    """Sums the gradients of distinct tasks per shard for the current step until `replicas`
    arrived for that shard.

    Not thread-safe (one serving thread per ps).
    """

    replicas: int
    step: int = 0

    def __post_init__(self) -> None:
        self._next_replicas = self.replicas
        self._sums: dict[str, np.ndarray] = {}
        self._contributors: dict[str, set[str]] = {}
        self._applied: set[str] = set()  # shards whose update of this step is applied
        self._empty: dict[str, set[str]] = {}  # per shard, the contributors that pushed nothing

    def add(self, task: str, step: int, grads: Mapping[str, np.ndarray]) -> PushOutcome:
        """Count a push of some shards. APPLIED: it completed every one of its shards (their
        averages wait in `take()`); ACCUMULATED: some still wait for other replicas; STALE: it
        was computed before this step, or one of its shards was already applied this step;
        DUPLICATE: `task` already pushed one of these shards this step."""
        if step < self.step or any(name in self._applied for name in grads):
            return PushOutcome.STALE
        if any(task in self._contributors.get(name, ()) for name in grads):
            return PushOutcome.DUPLICATE
        for name, grad in grads.items():
            total = self._sums.get(name)
            if total is None:
                self._sums[name] = np.array(grad, copy=True)
            else:
                total += grad
            self._contributors.setdefault(name, set()).add(task)
        complete = all(len(self._contributors[name]) >= self.replicas for name in grads)
        return PushOutcome.APPLIED if complete else PushOutcome.ACCUMULATED

    def add_empty(self, task: str, step: int, shards: Collection[str]) -> PushOutcome:
        """Count `task` for the current step of every shard of `shards` (all the ps holds) with
        no gradient: it has no data for this step. Outcomes as `add`'s."""
        if step < self.step or any(name in self._applied for name in shards):
            return PushOutcome.STALE
        if any(task in self._contributors.get(name, ()) for name in shards):
            return PushOutcome.DUPLICATE
        for name in shards:
            self._contributors.setdefault(name, set()).add(task)
            self._empty.setdefault(name, set()).add(task)
        complete = all(len(self._contributors[name]) >= self.replicas for name in shards)
        return PushOutcome.APPLIED if complete else PushOutcome.ACCUMULATED

    def take(self, shards: Collection[str]) -> dict[str, np.ndarray]:
        """The averaged gradients of the shards that every replica pushed, marked applied (a
        shard every replica pushed empty is marked applied and not returned: no update).
        When all of `shards` (every shard the ps holds) are applied, the step advances."""
        complete = [name for name, tasks in self._contributors.items()
                    if len(tasks) >= self.replicas and name not in self._applied]
        ready = {}
        for name in complete:
            total = self._sums.pop(name, None)
            if total is not None:  # some gradient came: the average of those that did
                total /= len(self._contributors[name]) - len(self._empty.get(name, ()))
                ready[name] = total
            self._applied.add(name)
        if self._applied.issuperset(shards):
            self._sums, self._contributors, self._applied, self._empty = {}, {}, set(), {}
            self.step += 1
            self.replicas = self._next_replicas
        return ready

    def set_quorum(self, replicas: int) -> None:
        """The membership changed: aggregate `replicas` (>= 1) gradients per step from now on —
        at once if that is fewer than the current step needs (call `take` next: shards may
        have just completed) or no gradient of the current step came yet, else from the next
        step."""
        self._next_replicas = max(1, replicas)
        if self._next_replicas < self.replicas or not (self._contributors or self._applied):
            self.replicas = self._next_replicas  # fewer, or the step has not begun: at once

    def mark_applied(self, names: Iterable[str]) -> None:
        """Shards whose update of the current step is already applied elsewhere (adopted from a
        ps that had finished the step; shoal/ps/adoption.py). Call `take` next: the step may be
        complete now."""
        self._applied.update(names)

    def forget(self, names: Iterable[str]) -> None:
        """Shards `names` left this ps (released to another): their partial sums of the current
        step are dropped (their pushers send them again to the new ps). Call `take` next: the
        step may be complete without them."""
        for name in names:
            self._sums.pop(name, None)
            self._contributors.pop(name, None)
            self._empty.pop(name, None)
            self._applied.discard(name)

    def applied(self, names: Iterable[str], step: int) -> bool:
        """Whether the update of `step` is applied to every shard of `names`."""
        return step < self.step or (step == self.step and all(name in self._applied for name in names))

    @property
    def between_steps(self) -> bool:
        """Whether no shard has its update of the current step applied yet (the values are all
        of one step: a consistent copy, e.g. a replica, can be taken)."""
        return not self._applied

    @property
    def contributors(self) -> set[str]:
        """The tasks that pushed some shard for the current step."""
        return set().union(*self._contributors.values()) if self._contributors else set()

    @property
    def waiting_for(self) -> int:
        """How many replicas the least complete shard of this step still waits for."""
        if not self._contributors:
            return self.replicas
        return self.replicas - min(len(tasks) for tasks in self._contributors.values())

    def abandon(self) -> None:
        """Drop the current step's partial sums (the step stays where it is; shards already
        applied this step stay applied)."""
        self._sums = {}
        self._contributors = {}
        self._empty = {}
