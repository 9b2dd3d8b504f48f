"""`LeaseLink`: what joins a `LeasedSampler` to the `DistributedOptimizer` of the same Job.

The optimizer attaches its session when it starts (the sampler leases through it); the sampler
records every position it hands the DataLoader; `step()` takes the positions recorded since the
last step and sends them with the push (`used=`), so ps 0 counts them consumed once applied.
Imports no torch. Not thread-safe: the training loop's thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.train.leased_data import LeasedBatch, merge_used

if TYPE_CHECKING:
    from shoal.ps.protocol import UsedPositions
    from shoal.train.session import TrainingSession


class LeaseLink:
    """The session to lease through (None until a DistributedOptimizer starts) and the
    positions handed out since the last step."""

    def __init__(self) -> None:
        self.session: TrainingSession | None = None
        self._handed: list[LeasedBatch] = []
        self._handed_count = 0

    def attach(self, session: "TrainingSession") -> None:
        self.session = session

    def record(self, batch: LeasedBatch) -> None:
        """The sampler handed `batch`'s examples to the DataLoader."""
        self._handed.append(batch)
        self._handed_count += len(batch)

    @property
    def handed(self) -> int:
        """How many positions were handed out since the last step (not pushed yet). O(1): the
        sampler asks once per example."""
        return self._handed_count

    def take_used(self) -> "UsedPositions | None":
        """The positions handed out since the last call (None if none): those this step used."""
        handed, self._handed, self._handed_count = self._handed, [], 0
        return merge_used(handed)
