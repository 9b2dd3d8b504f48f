"""TensorBoard event files for one training task, written with tensorboardX (no TensorFlow).

The chief writes into the model directory itself (loss, accuracy, learning_rate,
global_step/sec, step_time_ms); every other worker writes into `<model_dir>/<job>_<index>/`, so
TensorBoard shows one run per task and their step times side by side:

    tensorboard --logdir <model_dir>

On opening, a task prints where it writes, `summaries=<absolute directory>`, one line on
stderr (the launcher reads a task's stdout and stderr as one stream; the program's stdout
stays its own): the launcher records it, and `shoal tensorboard` serves what the tasks reported
(shoal/launch/logmux.py reads the line; launch and train share only this text).

Not thread-safe. `scalar` does not block on disk (tensorboardX writes from its own thread).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO


def _import_summary_writer():
    """tensorboardX.SummaryWriter, without letting it import PyTorch.

    tensorboardX imports torch when it is installed, only to accept torch tensors, which costs
    1.4 s per task; we pass it floats. If torch is already loaded (a PyTorch program) it is used
    as is.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class TaskSummaries:
    """Scalars of one task, plus its own step times averaged every `every_steps` local steps."""

    def __init__(self, logdir: str | Path, *, every_steps: int = 100, is_chief: bool,
                 out: IO[str] | None = None):
        self.logdir = Path(logdir)
        self._out = out
        self.every_steps = max(1, every_steps)
        self.is_chief = is_chief
        self._writer = None
        self._window_start: float | None = None
        self._window_steps = 0
        self._window_global = 0

    def open(self) -> "TaskSummaries":
        """Create the event file and print the `summaries=DIR` line. Blocks briefly
        (creates the directory)."""
        if self._writer is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = _import_summary_writer()(logdir=str(self.logdir), flush_secs=10)
            print(f"summaries={self.logdir.resolve()}", file=self._out or sys.stderr, flush=True)
        return self

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Record one value of `tag` at global step `step`."""
        if self._writer is not None:
            self._writer.add_scalar(tag, float(value), global_step=int(step))

    def step_done(self, global_step: int, learning_rate: float | None) -> None:
        """Count one finished local step; every `every_steps` write the mean step time (and, on
        the chief, the global step rate and the learning rate)."""
        now = time.monotonic()
        if self._window_start is None:
            self._window_start, self._window_global = now, global_step
            return
        self._window_steps += 1
        if self._window_steps < self.every_steps:
            return
        elapsed = now - self._window_start
        self.scalar("step_time_ms", 1000 * elapsed / self._window_steps, global_step)
        if self.is_chief:
            self.scalar("global_step/sec", (global_step - self._window_global) / max(elapsed, 1e-9), global_step)
            if learning_rate is not None:
                self.scalar("learning_rate", learning_rate, global_step)
        self._window_start, self._window_steps, self._window_global = now, 0, global_step

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file. Idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
