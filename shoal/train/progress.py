"""`ProgressReporter`: a worker's progress line, `<task> step=N loss=X examples/s=R`, which the
launcher reads to show the job's step and loss (`shoal status`, the live line). The chief's line
also counts the checkpoints it saved, `checkpoints=N` (each save is logged at DEBUG level only)."""

from __future__ import annotations

import sys
import time
from typing import IO


class ProgressReporter:
    """Prints a progress line every `every` local steps (and logs the loss as a summary when
    the session writes summaries). Not thread-safe; `step_done` does not block."""

    def __init__(self, session, every: int, batch_size: int, out: IO[str] | None = None):
        self._session = session
        self._every = max(1, every)
        self._batch_size = batch_size
        self._out = out or sys.stdout
        self._started = time.monotonic()
        self.local_steps = 0

    def step_done(self, loss: float, global_step: int) -> None:
        """Count one local step; print and log on every `every`-th."""
        self.local_steps += 1
        if self.local_steps % self._every:
            return
        rate = self.local_steps * self._batch_size / max(1e-9, time.monotonic() - self._started)
        checkpointer = getattr(self._session, "checkpointer", None)
        saves = f" checkpoints={checkpointer.saves}" if checkpointer is not None else ""
        print(f"{self._session.task} step={global_step} loss={loss:.4f} examples/s={rate:.0f}{saves}", file=self._out,
              flush=True)
        if self._session.summaries is not None:
            self._session.summaries.scalar("loss", loss, global_step)
