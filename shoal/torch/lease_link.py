"""`LeaseLink`: what joins a `LeasedSampler` to the `DistributedOptimizer` of the same Job.

The optimizer attaches its session when it starts (the sampler leases through it); the sampler
hands out the positions of one lease at a time (`begin_run`, then `hand(1)` per example, or
`hand(n)` per batch);
`step()` takes the positions handed out since the last step and sends them with the push
(`used=`), so ps 0 counts them consumed once applied. Per example this costs one integer
increment: the positions are cut out of the lease once per step. Imports no torch. Not
thread-safe: the training loop's thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from shoal.train.leased_data import LeasedBatch, merge_used

if TYPE_CHECKING:
    from shoal.ps.protocol import UsedPositions
    from shoal.train.session import TrainingSession


class LeaseLink:
    """The session to lease through (None until a DistributedOptimizer starts) and the
    positions handed out since the last step."""

    def __init__(self) -> None:
        self.session: TrainingSession | None = None
        self.values_changed: Callable[[], None] | None = None
        self._handed: list[LeasedBatch] = []  # whole pieces handed since the last step
        self._handed_count = 0
        self._run: LeasedBatch | None = None  # the lease the sampler hands examples from
        self._run_from = 0  # its first example not yet reported as used
        self._run_cursor = 0  # its examples handed out so far

    def attach(self, session: "TrainingSession", values_changed: Callable[[], None] | None = None) -> None:
        """Lease through `session`; `values_changed()` brings the session's values into the
        model after a sync step this worker took part in with no data (a sampler waiting for
        positions: `TrainingSession.leased_batches`)."""
        self.session = session
        self.values_changed = values_changed

    def begin_run(self, run: LeasedBatch) -> None:
        """The sampler will hand out `run`'s examples in order, `hand` for each; what is
        left of the previous run was never handed out (and is not reported)."""
        self._close_run()
        self._run, self._run_from, self._run_cursor = run, 0, 0

    def hand(self, count: int) -> None:
        """The sampler handed the next `count` examples of the current run to the DataLoader
        (1 per example, or a batch at once). O(1)."""
        self._run_cursor += count

    @property
    def handed(self) -> int:
        """How many positions were handed out since the last step (not pushed yet). O(1)."""
        return self._handed_count + self._run_cursor - self._run_from

    def take_used(self) -> "UsedPositions | None":
        """The positions handed out since the last call (None if none): those this step used."""
        if self._run is not None and self._run_cursor > self._run_from:
            self._handed.append(self._run.part(self._run_from, self._run_cursor))
            self._run_from = self._run_cursor
        handed, self._handed, self._handed_count = self._handed, [], 0
        return merge_used(handed)

    def _close_run(self) -> None:
        if self._run is not None and self._run_cursor > self._run_from:
            self._handed.append(self._run.part(self._run_from, self._run_cursor))
            self._handed_count += self._run_cursor - self._run_from
        self._run, self._run_from, self._run_cursor = None, 0, 0
