"""Straggler figures of a job's workers, from what their progress lines said (the records keep
each task's latest: shoal/launch/records.py): step time (median / p95 of its recent steps),
the share of its gradients applied, and a flag on a worker much slower than the others.

A task is flagged slow when its median step time is more than SLOW_FACTOR times the median of
the other tasks' median step times (at least two tasks must report one). With backup workers
(sync, replicas_to_aggregate < replicas) the gradients of the slowest replicas are dropped as
stale: `dropped` counts the steps a task's gradient was dropped from.

Pure and thread-safe.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from shoal.launch.records import TaskRecord
from shoal.wording import counted

SLOW_FACTOR = 1.5
"""A task whose median step time is over this many times the others' median is flagged."""


@dataclass(frozen=True)
class TaskFigures:
    """One task's straggler figures; None where its progress lines did not say."""

    name: str
    step_ms: Optional[float]
    p95_ms: Optional[float]
    applied: Optional[int]
    pushed: Optional[int]
    slow_by: Optional[float] = None
    """Its median step time over the others' median, when it is flagged slow; else None."""

    @property
    def slow(self) -> bool:
        return self.slow_by is not None

    @property
    def dropped(self) -> Optional[int]:
        """Steps its gradient was dropped from (pushed, not applied)."""
        return None if self.pushed is None or self.applied is None else self.pushed - self.applied

    @property
    def applied_share(self) -> Optional[float]:
        return None if not self.pushed or self.applied is None else self.applied / self.pushed

    def step_text(self) -> str:
        """"12.1/19.8" (median/p95 ms), or "-"."""
        if self.step_ms is None:
            return "-"
        return f"{self.step_ms:.1f}/{self.p95_ms:.1f}" if self.p95_ms is not None else f"{self.step_ms:.1f}"

    def applied_text(self) -> str:
        """"95/100 (95%)", or "-"."""
        if self.applied_share is None:
            return "-"
        return f"{self.applied}/{self.pushed} ({self.applied_share:.0%})"

    def flag_text(self) -> str:
        """"SLOW x2.3" (and "dropped from 40 steps" when some were), or ""."""
        if not self.slow:
            return ""
        text = f"SLOW x{self.slow_by:.1f}"
        if self.dropped:
            text += f", dropped from {counted(self.dropped, 'step')}"
        return text

    def as_json(self) -> dict:
        return {"step_ms": self.step_ms, "p95_ms": self.p95_ms, "applied": self.applied,
                "pushed": self.pushed, "dropped": self.dropped, "slow": self.slow,
                "slow_by": self.slow_by}


def figures(tasks: Sequence[TaskRecord]) -> list[TaskFigures]:
    """The figures of every task, in order, slow ones flagged. A task SCALED_DOWN or MOVED on
    purpose keeps its last figures but is neither compared nor flagged: they date from when the
    job had other workers."""
    times = {t.name: t.step_ms for t in tasks if t.step_ms is not None and t.step_ms > 0
             and not t.state.is_retired}
    out = []
    for t in tasks:
        slow_by = None
        others = [ms for name, ms in times.items() if name != t.name]
        if t.name in times and others:
            typical = statistics.median(others)
            if times[t.name] > SLOW_FACTOR * typical:
                slow_by = times[t.name] / typical
        out.append(TaskFigures(t.name, t.step_ms, t.p95_ms, t.applied, t.pushed, slow_by))
    return out
