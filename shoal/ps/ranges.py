"""`RangeSet`: a set of integers kept as sorted, disjoint half-open ranges [start, end).

The lease book's bookkeeping of positions (free, consumed, not yet reported). Memory is one
pair per range, never one entry per integer. Pure data; not thread-safe.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Iterator


class RangeSet:
    """Integers as sorted, disjoint, non-adjacent ranges (adjacent ones are merged).

    `add` refuses a range that overlaps the set and `remove` one the set does not cover
    (ValueError naming it): the book's invariants are checked at every change.
    """

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._total = 0  # kept by add and remove: a push's bookkeeping asks for it
        for start, end in ranges:
            self.add(start, end)

    def __len__(self) -> int:
        """How many ranges (not integers: see `total`)."""
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    @property
    def total(self) -> int:
        """How many integers the set holds. O(1)."""
        return self._total

    def covers(self, start: int, end: int) -> bool:
        """Whether every integer of [start, end) is in the set."""
        i = bisect_right(self._starts, start) - 1
        return start < end and i >= 0 and self._ends[i] >= end

    def overlaps(self, start: int, end: int) -> bool:
        """Whether some integer of [start, end) is in the set."""
        i = bisect_right(self._starts, end - 1) - 1
        return start < end and i >= 0 and self._ends[i] > start

    def add(self, start: int, end: int) -> None:
        if not start < end:
            raise ValueError(f"empty range [{start}, {end})")
        if self.overlaps(start, end):
            raise ValueError(f"[{start}, {end}) overlaps {self!r}")
        self._total += end - start
        i = bisect_right(self._starts, start)
        if i > 0 and self._ends[i - 1] == start:  # joins the range before
            i -= 1
            start = self._starts[i]
            del self._starts[i], self._ends[i]
        if i < len(self._starts) and self._starts[i] == end:  # joins the range after
            end = self._ends[i]
            del self._starts[i], self._ends[i]
        self._starts.insert(i, start)
        self._ends.insert(i, end)

    def remove(self, start: int, end: int) -> None:
        if not self.covers(start, end):
            raise ValueError(f"[{start}, {end}) is not all in {self!r}")
        self._total -= end - start
        i = bisect_right(self._starts, start) - 1
        s, e = self._starts[i], self._ends[i]
        del self._starts[i], self._ends[i]
        for piece in ((end, e), (s, start)):  # insert the right piece first, so both land at i
            if piece[0] < piece[1]:
                self._starts.insert(i, piece[0])
                self._ends.insert(i, piece[1])

    def take_first(self, count: int) -> tuple[int, int] | None:
        """Remove and return up to `count` integers from the start of the lowest range; None if empty."""
        if not self._starts:
            return None
        start = self._starts[0]
        end = min(self._ends[0], start + count)
        self.remove(start, end)
        return start, end
