"""`ProgressReporter`: a worker's progress line, which the launcher reads to show the job's step
and loss (`shoal status`, the live line), to notice a stalled job (its watchdog) and to spot
stragglers::

    worker:1 step=200 loss=0.3012 examples/s=812 step_ms=12.1 p95_ms=19.8 applied=95/100

`step_ms` / `p95_ms` are the median / 95th percentile wall time of this worker's last
`WINDOW` local steps (from one `step_done` to the next), `applied=A/P` how many of the P
gradients it pushed so far were applied (the others were dropped as stale: sync mode with
backup workers); it is left out when the caller does not say. The chief's line also counts
the checkpoints it saved, `checkpoints=N` (each save is logged at DEBUG level only). The
fields up to examples/s come first and keep their format (shoal/launch/progress_line.py reads
old and new lines)."""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import IO

from shoal.train.step_window import StepWindow

WINDOW = 100
"""Local steps the step-time figures are taken over."""


class ProgressReporter:
    """Prints a progress line every `every` local steps (and logs the loss as a summary when
    the session writes summaries). Not thread-safe; `step_done` does not block."""

    def __init__(self, session, every: int, batch_size: int, out: IO[str] | None = None,
                 clock=time.monotonic):
        self._session = session
        self._every = max(1, every)
        self._batch_size = batch_size
        self._out = out or sys.stdout
        self._clock = clock
        self._started = clock()
        self._last = self._started
        self._step_s = StepWindow(WINDOW)  # kept sorted: a line every step reads its median cheaply
        self.local_steps = 0
        self.pushed = 0
        self.applied = 0
        self._last_loss: float | None = None
        self._printed_step: int | None = None

    def step_done(self, loss: float, global_step: int, applied: bool | None = None) -> None:
        """Count one local step (`applied`: whether the ps applied its gradient, as
        `StepResult.applied` says; None: not known); print and log on every `every`-th."""
        now = self._clock()
        self._step_s.add(now - self._last)
        self._last = now
        self.local_steps += 1
        if applied is not None:
            self.pushed += 1
            self.applied += bool(applied)
        self._last_loss = loss
        if self.local_steps % self._every:
            return
        self._printed_step = global_step
        rate = self.local_steps * self._batch_size / max(1e-9, now - self._started)
        median_ms, p95_ms = self._step_s.figures_ms()
        shares = f" applied={self.applied}/{self.pushed}" if self.pushed else ""
        checkpointer = getattr(self._session, "checkpointer", None)
        saves = f" checkpoints={checkpointer.saves}" if checkpointer is not None else ""
        print(f"{self._session.task} step={global_step} loss={loss:.4f} examples/s={rate:.0f}"
              f" step_ms={median_ms:.1f} p95_ms={p95_ms:.1f}{shares}{saves}", file=self._out, flush=True)
        if self._session.summaries is not None:
            self._session.summaries.scalar("loss", loss, global_step)

    def finish(self, global_step: int) -> None:
        """After the last step: print `<task> step=<global_step> loss=<last loss> final` unless
        the last line printed already said that step, so `shoal status` ends on the step the
        job trained to. The line has no examples/s: readers of the rate (the benchmarks) count
        only the lines `step_done` prints. Does not block."""
        if self._last_loss is None or self._printed_step == global_step:
            return
        self._printed_step = global_step
        print(f"{self._session.task} step={global_step} loss={self._last_loss:.4f} final", file=self._out, flush=True)


def step_time_ms(seconds) -> tuple[float, float]:
    """(median, 95th percentile by nearest rank) of step times in seconds, in ms; (0, 0) for none."""
    if not seconds:
        return 0.0, 0.0
    ordered = sorted(seconds)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return statistics.median(ordered) * 1000, p95 * 1000
