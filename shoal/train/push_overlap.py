"""`PushOverlap`: an asynchronous worker's push overlapped with its next step.

A worker that pushes and waits for the new values leaves its core idle for the round trip, and
on a busy machine for the wake-ups around it (bench/README.md, "A push overlapped with the next
step"). With `TrainingSession(..., overlap_push=True)` (`--overlap_push`) a push goes out and
returns at once; the worker computes its next gradient while the ps applies this one, and the
next push first waits for this one's answer, then goes out. So one push is in flight at a time,
and every gradient is computed on values that miss the worker's own last gradient: one step
staler than without the overlap, as if one more worker trained. Asynchronous training only: a
synchronous step's gradients must all be computed on that step's values.

What a push returns, with the overlap, is the result of the push before it (the first returns
the step it was sent at, and `applied=None`: not known yet). So `should_stop` learns of the last
step one push late, and each worker sends one gradient past `max_steps`. `pull`, a checkpoint
and the end of the session wait for the push in flight first. A gradient of 2 MiB or more is
copied before it goes (zmq sends such a frame without a copy, maybe after `push` returned; the
program may reuse its buffer). Not thread-safe: the session's thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from shoal.ps.protocol import ClosureTag, Hyper, UsedPositions
from shoal.train.options import StepResult


@dataclass
class OutgoingPush:
    """One gradient on its way: what `TrainingSession.push` was given, checked, and, once sent,
    the parts that went (by the placement at that moment) and what to wait on."""

    arrays: dict[str, np.ndarray]
    hyper: Mapping[str, Hyper] | None
    used: UsedPositions | None
    closure: ClosureTag | None
    parts: list[tuple[int, dict[str, np.ndarray]]] | None = None
    sent: Any = None  # the PsClient's SentRequests
    empty: bool = False  # zeros standing for no data for a sync step (PushRequest.empty)


class PushOverlap:
    """Holds the one push in flight. `send(push)` queues a push and returns it; `finish(push)`
    waits for its answers and returns its StepResult; `current()` is the StepResult a first push
    returns (nothing finished yet)."""

    def __init__(self, send: Callable[[OutgoingPush], OutgoingPush], finish: Callable[[OutgoingPush], StepResult],
                 current: Callable[[], StepResult]) -> None:
        self._send = send
        self._finish = finish
        self._current = current
        self._in_flight: OutgoingPush | None = None

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def push(self, outgoing: OutgoingPush) -> StepResult:
        """Finish the push in flight, if any, then send `outgoing`; the finished push's result.
        If finishing raises, `outgoing` is not sent. Blocks while the push in flight is not
        answered."""
        result = self.settle()
        if result is None:
            result = self._current()
        self._in_flight = self._send(outgoing)
        return result

    def settle(self) -> StepResult | None:
        """Wait for the push in flight, if any; its result (None when none was). Blocks."""
        previous, self._in_flight = self._in_flight, None
        return self._finish(previous) if previous is not None else None

    def drop(self) -> None:
        """Forget the push in flight (the session ends by an error: whatever reached the ps is
        applied there, and nobody waits for its answer). Does not block."""
        self._in_flight = None
