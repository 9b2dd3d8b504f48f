"""`StepWindow`: the last N step times, kept sorted as they come, so the median and the 95th
percentile of the window are read without sorting it (a progress line may print every step)."""

from __future__ import annotations

import bisect
import math
from collections import deque


class StepWindow:
    """The last `size` step times in seconds. `add` is O(log size) plus a C-level list move;
    `figures_ms` gives the median and 95th percentile `shoal.train.progress.step_time_ms` gives
    for the same times. Not thread-safe; nothing blocks."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a step window holds at least one step time, got size={size}")
        self.size = size
        self._arrived: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._arrived)

    def add(self, seconds: float) -> None:
        if len(self._arrived) == self.size:
            oldest = self._arrived.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrived.append(seconds)
        bisect.insort(self._sorted, seconds)

    def figures_ms(self) -> tuple[float, float]:
        """(median, 95th percentile by nearest rank) in ms; (0, 0) while empty."""
        ordered = self._sorted
        n = len(ordered)
        if not n:
            return 0.0, 0.0
        half = n // 2
        median = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2
        return median * 1000, ordered[max(0, math.ceil(0.95 * n) - 1)] * 1000
