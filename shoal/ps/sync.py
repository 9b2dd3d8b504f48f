"""Synchronous aggregation: average `replicas` fresh gradients per shard and step, drop stale ones.

`replicas` (the quorum) follows the membership (shoal/ps/membership.py): a quorum that grows
(a member joined) takes effect at the next step (at once if the current one has no gradient
yet); one that shrinks (a member left) at once, so the current step completes without the
member that left. Each shard's update is the average
of the gradients actually summed for it.

A replica with no data for a step (its leases ran out while others finish theirs, at the end of
the epochs asked for) pushes *empty* (`add(..., empty=True)`): it is not one of the gradients
the step waits for, and it lowers what the step needs: a shard completes with `replicas` minus
(empty pushes beyond the `backups`) real gradients, which is every live replica that has data
when there are more without data than backups, and the average is of the real ones. A shard
whose step nobody brought a gradient to (every live replica pushed empty) is marked applied
with no update (no optimizer step on a zero gradient: momentum or Adam state does not move).

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
    backups: int = 0  # live replicas the step does not wait for (replicas + backups = live members)

    def __post_init__(self) -> None:
        self._next_replicas = self.replicas
        self._sums: dict[str, np.ndarray] = {}
        self._contributors: dict[str, set[str]] = {}
        self._applied: set[str] = set()  # shards whose update of this step is applied
        self._empty: dict[str, set[str]] = {}  # per shard, the contributors that pushed nothing

    def add(self, task: str, step: int, grads: Mapping[str, np.ndarray], empty: bool = False) -> PushOutcome:
        """Count a push of some shards (`empty`: the task has no data for this step; `grads` are
        not summed). APPLIED: it completed every one of its shards (their averages wait in
        `take()`); ACCUMULATED: some still wait for other replicas; STALE: it was computed
        before this step, or one of its shards was already applied this step; DUPLICATE:
        `task` already pushed one of these shards this step."""
        if step < self.step or any(name in self._applied for name in grads):
            return PushOutcome.STALE
        if any(task in self._contributors.get(name, ()) for name in grads):
            return PushOutcome.DUPLICATE
        for name, grad in grads.items():
            if empty:
                self._empty.setdefault(name, set()).add(task)
            else:
                total = self._sums.get(name)
                if total is None:
                    self._sums[name] = np.array(grad, copy=True)
                else:
                    total += grad
            self._contributors.setdefault(name, set()).add(task)
        if self._empty:
            complete = all(self._missing(name) <= 0 for name in grads)
        else:  # (the usual step: every push brings a gradient; no call per shard)
            complete = all(len(self._contributors[name]) >= self.replicas for name in grads)
        return PushOutcome.APPLIED if complete else PushOutcome.ACCUMULATED

    def _missing(self, name: str) -> int:
        """How many more real gradients shard `name` needs this step: `replicas`, less the empty
        pushes beyond the backups, less those that came."""
        empties = len(self._empty.get(name, ()))
        needed = self.replicas - max(0, empties - self.backups)
        return needed - (len(self._contributors.get(name, ())) - empties)

    def take(self, shards: Collection[str]) -> dict[str, np.ndarray]:
        """The averaged gradients of the shards that have all they need (`add`), marked applied
        (a shard no real gradient came to is marked applied and not returned: no update; it
        shows in `applied_count`). When all of `shards` (every shard the ps holds) are applied,
        the step advances."""
        if self._empty:
            complete = [name for name in self._contributors if name not in self._applied and self._missing(name) <= 0]
        else:  # (the usual step: the shards not applied yet are those with a sum)
            complete = [name for name in self._sums if len(self._contributors[name]) >= self.replicas]
        ready = {}
        for name in complete:
            total = self._sums.pop(name, None)
            if total is not None:  # the average of the real gradients
                total /= len(self._contributors[name]) - len(self._empty.get(name, ()))
                ready[name] = total
            self._applied.add(name)
        if self._applied.issuperset(shards):
            self._sums, self._contributors, self._applied, self._empty = {}, {}, set(), {}
            self.step += 1
            self.replicas = self._next_replicas
        return ready

    def set_quorum(self, replicas: int, live: Collection[str] | None = None) -> None:
        """The membership changed: aggregate `replicas` (>= 1) gradients per step from now on —
        at once if that is fewer than the current step needs (call `take` next: shards may
        have just completed) or no gradient of the current step came yet, else from the next
        step. With `live` (the live members): the backups are the live members beyond
        `replicas` (fewer once the members are fewer than the backups asked for), and a task no
        longer live that pushed empty this step stops counting (it brought no gradient, and its
        restarted process may push for the step)."""
        self._next_replicas = max(1, replicas)
        if live is not None:
            self.backups = max(0, len(live) - self._next_replicas)
            self._forget_empty_of(self.contributors - set(live))
        if self._next_replicas < self.replicas or not (self._contributors or self._applied):
            self.replicas = self._next_replicas  # fewer, or the step has not begun: at once

    def _forget_empty_of(self, tasks: set[str]) -> None:
        """Tasks `tasks` left: drop their empty pushes of this step (their real gradients stay
        summed, as a departed task's always did)."""
        for name, empty in list(self._empty.items()):
            gone = empty & tasks
            if gone:
                empty -= gone
                self._contributors[name] -= gone
                if not empty:
                    del self._empty[name]
                if not self._contributors[name]:
                    del self._contributors[name]

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
    def applied_count(self) -> int:
        """How many shards have their update of the current step applied (or, for a shard only
        empty pushes came to, marked applied with none)."""
        return len(self._applied)

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
        return max(self._missing(name) for name in self._contributors)

    def abandon(self) -> None:
        """Drop the current step's partial sums (the step stays where it is; shards already
        applied this step stay applied)."""
        self._sums = {}
        self._contributors = {}
        self._empty = {}
