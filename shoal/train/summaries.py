"""TensorBoard event files for one training task, written with tensorboardX (no TensorFlow).

The chief writes into the model directory itself (loss, accuracy, learning_rate,
global_step/sec, step_time_ms); every other worker writes into `<model_dir>/<job>_<index>/`, so
TensorBoard shows one run per task and their step times side by side:

    tensorboard --logdir <model_dir>

On opening, a task prints where it writes, `summaries=<absolute directory>`, one line on
stderr (the launcher reads a task's stdout and stderr as one stream; the program's stdout
stays its own): the launcher records it, and `shoal tensorboard` serves what the tasks reported
(shoal/launch/logmux.py reads the line; launch and train share only this text).

Summaries never block or stop training: the event file is written from a thread of its own
(shoal/train/event_file.py), so `scalar` and `step_done` never wait for the disk, and a write
that fails (a full disk, say) pauses the summaries with one warning naming the directory and the
error while training goes on; they go on in a new event file once the disk has room again.

Not thread-safe (the training thread calls it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO

from shoal.train.event_file import EventFile


class TaskSummaries:
    """Scalars of one task, plus its own step times averaged every `every_steps` local steps."""

    def __init__(self, logdir: str | Path, *, every_steps: int = 100, is_chief: bool,
                 out: IO[str] | None = None):
        self.logdir = Path(logdir)
        self._out = out
        self.every_steps = max(1, every_steps)
        self.is_chief = is_chief
        self._file: EventFile | None = None
        self._window_start: float | None = None
        self._window_steps = 0
        self._window_global = 0

    def open(self) -> "TaskSummaries":
        """Create the event file and print the `summaries=DIR` line. Blocks briefly (creates the
        directory and the file). A directory that cannot be written is one warning, not an error:
        the task trains without summaries."""
        if self._file is None:
            self._file = EventFile(self.logdir)
            if self._file.open():
                print(f"summaries={self.logdir.resolve()}", file=self._out or sys.stderr, flush=True)
        return self

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Record one value of `tag` at global step `step`. Never blocks."""
        if self._file is not None:
            self._file.add_scalar(tag, value, step)

    def step_done(self, global_step: int, learning_rate: float | None) -> None:
        """Count one finished local step; every `every_steps` write the mean step time (and, on
        the chief, the global step rate and the learning rate). Never blocks."""
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
        """Ask for what was recorded to be flushed to disk soon. Does not block."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the event file. Blocks up to a few seconds (EventFile.close).
        Idempotent; never raises."""
        if self._file is not None:
            self._file.close()
            self._file = None
