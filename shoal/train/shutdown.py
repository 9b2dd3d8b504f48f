"""`GracefulStop`: a part of TrainingSession that turns SIGTERM into a clean end of training, and
`TrainingTerminated`, the exception that ends it.

`shoal kill`, a job's deadline and a scheduler's preemption all send SIGTERM, then SIGKILL after
a grace period (the launcher's `grace_period`, 5 s by default). While a session is started,
SIGTERM only sets a flag (shoal/sigterm.py); at the next step boundary — the end of `push`, after
the step's update is applied — the chief saves a checkpoint and the session raises
`TrainingTerminated`. Every replica, the chief included, raises it, so all leave the loop at the
same step; the `with` block then tells the ps tasks the replica left (as a failure, so a restarted
replica is still counted), and the program exits with status 143 (128 + SIGTERM) unless it
catches the exception. A second SIGTERM ends the process at once.

Nothing to add to a training loop: `with TrainingSession(...) as session:` gets this for free. A
program that installed its own SIGTERM handler keeps it; it can call `shoal.sigterm.request()`
from that handler to get the same behaviour. Not thread-safe (like the session it belongs to).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional

import shoal.sigterm as sigterm
from shoal.train.checkpoint import checkpoint_step

log = logging.getLogger("shoal.train.session")

EXIT_STATUS = sigterm.EXIT_STATUS
"""The exit status of a program that ends by TrainingTerminated: 143, as a shell reports SIGTERM."""


class TrainingTerminated(SystemExit):
    """Training stopped at a step boundary because the process got SIGTERM (after the chief's
    final checkpoint, `checkpoint`, if it could save one). A SystemExit: `except Exception` does
    not catch it, and uncaught it ends the program with status 143 and no traceback."""

    def __init__(self, task: str, step: int, checkpoint: Optional[Path] = None) -> None:
        super().__init__(EXIT_STATUS)
        self.task = task
        self.step = step
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f"; final checkpoint {self.checkpoint}" if self.checkpoint else ""
        saved_step = checkpoint_step(self.checkpoint) if self.checkpoint else None
        if saved_step is not None and saved_step != self.step:
            saved += f" (step {saved_step}: the other replicas' pushes since included)"
        return f"{self.task} stopped training at global step {self.step} on SIGTERM{saved}"


class GracefulStop:
    """Watches for SIGTERM while a session is started. `open` (at the session's start) and
    `close` (at its close, idempotent) pair up; the constructor does nothing."""

    def __init__(self, task: str) -> None:
        self._task = task
        self._open = False

    def open(self) -> None:
        if self._open:
            return
        self._open = True
        if not sigterm.acquire():
            log.debug("%s: SIGTERM is not watched (not the main thread, or the program handles it)", self._task)

    def close(self) -> None:
        if self._open:
            self._open = False
            sigterm.release()

    @property
    def requested(self) -> bool:
        """Whether this process was asked to finish (SIGTERM)."""
        return self._open and sigterm.requested()

    def stop(self, step: int, save: Optional[Callable[[], Path]]) -> None:
        """At a step boundary, if SIGTERM came: run `save` (the chief's final checkpoint; a
        failure is logged, not raised) and raise TrainingTerminated. Otherwise return. Blocks
        for the save."""
        if not self.requested:
            return
        path = None
        if save is not None:
            try:
                path = save()
            except Exception as e:  # noqa: BLE001 — the checkpoint is best effort; stopping is not
                log.warning("%s could not save a final checkpoint at step %d on SIGTERM: %s", self._task, step, e)
        stopped = TrainingTerminated(self._task, step, path)
        log.info("%s", stopped)
        raise stopped
