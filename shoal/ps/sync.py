"""Synchronous aggregation: average `replicas` fresh gradients per step, drop stale ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from shoal.ps.protocol import PushOutcome


@dataclass
class SyncAggregator:
    """Sums the gradients of distinct tasks for the current step until `replicas` arrived.

    Not thread-safe (one serving thread per ps).
    """

    replicas: int
    step: int = 0

    def __post_init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._contributors: set[str] = set()

    def add(self, task: str, step: int, grads: Mapping[str, np.ndarray]) -> PushOutcome:
        """Count a push. When it completes the step, the averaged gradients wait in `take()`."""
        if step < self.step:
            return PushOutcome.STALE
        if task in self._contributors:
            return PushOutcome.DUPLICATE
        for name, grad in grads.items():
            total = self._sums.get(name)
            if total is None:
                self._sums[name] = np.array(grad, copy=True)
            else:
                total += grad
        self._contributors.add(task)
        return PushOutcome.APPLIED if len(self._contributors) >= self.replicas else PushOutcome.ACCUMULATED

    def take(self) -> dict[str, np.ndarray]:
        """The averaged gradients of the completed step; advances the step."""
        averaged = self._sums
        for total in averaged.values():
            total /= self.replicas
        self._sums = {}
        self._contributors = set()
        self.step += 1
        return averaged

    @property
    def waiting_for(self) -> int:
        return self.replicas - len(self._contributors)

    @property
    def contributors(self) -> frozenset[str]:
        """The tasks whose gradients the current step holds."""
        return frozenset(self._contributors)

    def abandon(self) -> None:
        """Drop the current step's partial sums (the step stays where it is)."""
        self._sums = {}
        self._contributors = set()
