"""`ClosureLedger`: which pushes of scheduled closures a ps already applied, so a closure that is
re-run (its worker died, docs/coordinator.md) has each of its pushes applied at most once.

A push tagged with a `ClosureTag` (closure id, push index) names the shards it carries; the
ledger remembers, per tag, the shards applied and the step they were applied in. A later push
with the same tag and shards is a duplicate: the ps answers it DUPLICATE and applies nothing,
when the original would have been answered (in sync mode once that step is applied) and with
the values of then. Parts of one push reach a ps as separate requests, so the unit is (tag,
shards): a worker that died between two parts gets the missing part applied when the closure is
re-run.

Memory is bounded: the ledger holds the `window` most recently recorded tags (default
DEFAULT_WINDOW) and forgets older ones, first in, first out. A re-run is recognized as long as
fewer than `window` other tagged pushes reached this ps between the original and the re-run;
a ps that restarts starts with an empty ledger (its shards come back from a checkpoint, which
predates the pushes it forgot). Not thread-safe (the ps's serving thread only); no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Collection

from shoal.ps.errors import PsError
from shoal.ps.protocol import ClosureTag

DEFAULT_WINDOW = 1 << 15
"""Tags remembered per ps (about 10 MB at most with short shard names)."""


class ClosureLedger:
    """The recently applied (closure, push) tags of one ps and the shards each applied.
    `applied` and `duplicates` count push parts recorded and refused since the ps started."""

    def __init__(self, window: int = DEFAULT_WINDOW):
        if not isinstance(window, int) or window < 1:
            raise PsError(f"the closure ledger's window must be an int >= 1, got {window!r}")
        self.window = window
        self.applied = 0
        self.duplicates = 0
        self._tags: OrderedDict[tuple[str, int], set[str]] = OrderedDict()
        self._steps: dict[tuple[str, int], int] = {}  # the step each tag's shards were (last) applied in

    def __len__(self) -> int:
        return len(self._tags)

    def is_duplicate(self, tag: ClosureTag, shards: Collection[str]) -> bool:
        """Whether `shards` of `tag` were applied already (counted as a duplicate then). Raises
        PsError if only some were: the pushes of one closure were placed differently, which
        happens only if the workers do not run the same program."""
        applied = self._tags.get((tag.closure, tag.push))
        if not applied:
            return False
        seen = applied.intersection(shards)
        if not seen:
            return False
        if len(seen) != len(shards):
            raise PsError(f"{tag} was applied for shards {sorted(seen)[:5]} but now comes with "
                          f"{sorted(set(shards) - seen)[:5]} too; every worker must place the variables the same "
                          "way (run the same program with the same variables and options)")
        self.duplicates += 1
        return True

    def step_of(self, tag: ClosureTag) -> int:
        """The step `tag` was recorded in (its latest part); 0 for a tag it does not hold."""
        return self._steps.get((tag.closure, tag.push), 0)

    def record(self, tag: ClosureTag, shards: Collection[str], step: int = 0) -> None:
        """Remember that `shards` of `tag` were applied (or counted in sync step `step`)."""
        key = (tag.closure, tag.push)
        applied = self._tags.get(key)
        if applied is None:
            self._tags[key] = applied = set()
            while len(self._tags) > self.window:
                forgotten, _ = self._tags.popitem(last=False)
                self._steps.pop(forgotten, None)
        applied.update(shards)
        self._steps[key] = step
        self.applied += 1
