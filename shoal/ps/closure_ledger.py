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
a ps that restarts starts with an empty ledger (its shards come back from a replica or a
checkpoint, and a push resent to it is dropped as rolled back or stale). Each tag costs a few
hundred bytes however many shards its push carries, so the whole ledger stays within about
`window` x 500 bytes plus one entry per shard of the ps; only authenticated pushes reach it.
Not thread-safe (the ps's serving thread only); no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Collection

from shoal.ps.errors import PsError
from shoal.ps.protocol import ClosureTag

DEFAULT_WINDOW = 1 << 15
"""Tags remembered per ps: a few hundred bytes each, however many shards their pushes carry
(about 15 MB in all)."""


class ClosureLedger:
    """The recently applied (closure, push) tags of one ps and the shards each applied.
    `applied` and `duplicates` count push parts recorded and refused since the ps started.

    The shards a tag applied are kept as a bit mask over the shard names the ledger has seen
    (each name once), not as a copy of the names per tag: a push carrying hundreds of shards
    costs the same few hundred bytes as one carrying one. The names must be shards the ps holds
    (the service checks them first), so that table is bounded by the ps's shards.
    """

    def __init__(self, window: int = DEFAULT_WINDOW):
        if not isinstance(window, int) or window < 1:
            raise PsError(f"the closure ledger's window must be an int >= 1, got {window!r}")
        self.window = window
        self.applied = 0
        self.duplicates = 0
        self._bits: dict[str, int] = {}  # shard name -> its bit
        # (closure, push) -> [shards applied (mask), the step they were (last) counted in]
        self._tags: OrderedDict[tuple[str, int], list[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tags)

    def is_duplicate(self, tag: ClosureTag, shards: Collection[str]) -> bool:
        """Whether `shards` of `tag` were applied already (counted as a duplicate then). Raises
        PsError if only some were: the pushes of one closure were placed differently, which
        happens only if the workers do not run the same program."""
        entry = self._tags.get((tag.closure, tag.push))
        if entry is None:
            return False
        mask = self._mask(shards)
        seen = entry[0] & mask
        if not seen:
            return False
        if seen != mask:
            names = sorted(shards)
            applied = [n for n in names if entry[0] & self._bits[n]]
            raise PsError(f"{tag} was applied for shards {applied[:5]} but now comes with "
                          f"{[n for n in names if n not in applied][:5]} too; every worker must place the variables "
                          "the same way (run the same program with the same variables and options)")
        self.duplicates += 1
        return True

    def step_of(self, tag: ClosureTag) -> int:
        """The step `tag` was recorded in (its latest part); 0 for a tag it does not hold."""
        entry = self._tags.get((tag.closure, tag.push))
        return entry[1] if entry is not None else 0

    def record(self, tag: ClosureTag, shards: Collection[str], step: int = 0) -> None:
        """Remember that `shards` of `tag` were applied (or counted in sync step `step`)."""
        key = (tag.closure, tag.push)
        entry = self._tags.get(key)
        if entry is None:
            self._tags[key] = entry = [0, step]
            while len(self._tags) > self.window:
                self._tags.popitem(last=False)
        entry[0] |= self._mask(shards)
        entry[1] = step
        self.applied += 1

    def _mask(self, shards: Collection[str]) -> int:
        mask = 0
        for name in shards:
            bit = self._bits.get(name)
            if bit is None:
                bit = self._bits[name] = 1 << len(self._bits)
            mask |= bit
        return mask
