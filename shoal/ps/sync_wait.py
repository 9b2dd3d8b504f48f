"""What a synchronous step waits for, in words, on both sides of the wire.

A sync step completes when `replicas` distinct replicas pushed a gradient for it. A step that
does not complete is nearly always a replica that is not pushing (dead, stuck, or finished
early), and the ps knows which: `SyncWait` names them. The ps logs it (`SyncWaitWatch` says
when) and answers it in its status reply (`sync_have`, `sync_needed`, `sync_missing`), so a
worker whose push waits can name the missing replicas too, instead of blaming the ps.

Pure data and arithmetic: no I/O, no clock of its own. `SyncWait` is immutable and
thread-safe; `SyncWaitWatch` is not (one per ps, on its serving thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from shoal.wording import counted

SYNC_WAIT_LOG_AFTER_S = 10.0
"""A ps logs what a sync step waits for once the step waited this long, and again as often."""


@dataclass(frozen=True)
class SyncWait:
    """One ps's current sync step: which replicas' gradients arrived (`have`), how many more
    the step needs (`needed`), and the replicas that have not pushed for it (`missing`; empty
    when the ps does not know the replicas' names). `done`: replicas that finished training
    (they push no more)."""

    step: int
    have: tuple[str, ...]
    needed: int
    missing: tuple[str, ...] = ()
    done: tuple[str, ...] = ()

    @property
    def waiting(self) -> bool:
        """Whether the step waits for anyone (it does until `needed` more arrived)."""
        return self.needed > 0

    def describe(self) -> str:
        """E.g. "step 12 waits for 1 more gradient, from worker:1 (has chief:0's)"; with
        backup workers "... from any of worker:1, worker:2"."""
        more = counted(self.needed, "more gradient")
        if self.missing:
            names = ", ".join(f"{m} (done)" if m in self.done else m for m in self.missing)
            who = f", from {names}" if len(self.missing) <= self.needed else f", from any of {names}"
        else:
            who = ""
        has = f"has {', '.join(self.have)}'s" if self.have else "has no gradient yet"
        return f"step {self.step} waits for {more}{who} ({has})"


def sync_wait(step: int, contributors: Iterable[str], needed: int, replica_names: Iterable[str],
              done: Iterable[str] = ()) -> SyncWait:
    """The SyncWait of a step that has `contributors` and needs `needed` more gradients, in a
    job whose replicas are `replica_names` (in their order)."""
    have = tuple(sorted(contributors))
    missing = tuple(name for name in replica_names if name not in have)
    return SyncWait(step, have, needed, missing, tuple(sorted(done)))


class SyncWaitWatch:
    """Says when a ps should log what its sync step waits for: once the step has waited
    `after_s` since its first gradient arrived, then every `after_s` while it still waits.
    Times are whatever monotonic clock the caller passes."""

    def __init__(self, after_s: float = SYNC_WAIT_LOG_AFTER_S) -> None:
        self.after_s = after_s
        self._step: int | None = None
        self._since = 0.0
        self._next = 0.0

    def gradient_arrived(self, step: int, now: float) -> None:
        """A gradient for `step` was counted and the step still waits."""
        if self._step != step:
            self._step, self._since, self._next = step, now, now + self.after_s

    def step_completed(self) -> None:
        self._step = None

    def due(self, now: float) -> float | None:
        """Seconds the step has waited if it is time to say so (then not again for `after_s`), else None."""
        if self._step is None or now < self._next:
            return None
        self._next = now + self.after_s
        return now - self._since
