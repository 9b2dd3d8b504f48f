"""`ClosureTags`: tags the pushes a TrainingSession sends while it runs one scheduled closure.

A worker serving a coordinator (in-graph training, docs/coordinator.md) runs each closure inside
`session.closure(closure_id)`. Every push in that block carries `ClosureTag(closure_id, n)`,
n counting the block's pushes from 0, so a ps applies each push of a closure at most once even
when the closure is re-run on another worker after its first worker died
(shoal/ps/closure_ledger.py). Outside a block pushes carry no tag, as in between-graph training.

Not thread-safe: the session's thread only. No I/O.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from shoal.ps.protocol import MAX_CLOSURE_ID, ClosureTag
from shoal.train.errors import TrainError


class ClosureTags:
    """The closure whose pushes are being tagged now, if any, and its next push index."""

    def __init__(self) -> None:
        self._closure: str | None = None
        self._next = 0

    @contextlib.contextmanager
    def running(self, closure_id: str) -> Iterator[None]:
        """Tag the pushes of this block with `closure_id`. Blocks may not nest."""
        if not isinstance(closure_id, str) or not 0 < len(closure_id) <= MAX_CLOSURE_ID:
            raise TrainError(f"a closure id must be a string of 1 to {MAX_CLOSURE_ID} characters, "
                             f"got {closure_id!r:.80}")
        if self._closure is not None:
            raise TrainError(f"closure {closure_id!r} started while closure {self._closure!r} still runs; "
                             "run one closure at a time per session")
        self._closure, self._next = closure_id, 0
        try:
            yield
        finally:
            self._closure = None

    def next_tag(self) -> ClosureTag | None:
        """The tag of the next push (None outside a closure); counts it."""
        if self._closure is None:
            return None
        tag = ClosureTag(self._closure, self._next)
        self._next += 1
        return tag
