"""`Checkpointer`: the chief's checkpoints of one job: when one is due, taking it (a snapshot of
every ps, joined into whole variables), and reading the newest back for a restore.

A part of TrainingSession; only the chief has one. Every call blocks on the network and the
filesystem; not thread-safe.

Each save is logged with why it was taken (`SaveReason`): a periodic one at DEBUG level only (a
long run takes many; the progress line counts them, `checkpoints=N`), the others — at the end of
training, on SIGTERM, on request — at INFO.
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from pathlib import Path

from shoal.ps.client import PsClient
from shoal.train.checkpoint import (Checkpoint, CheckpointError, CheckpointWriteError, checkpoint_root, export_model,
                                    load_latest_checkpoint)
from shoal.train.checkpoint import save_checkpoint as write_checkpoint
from shoal.train.local_state import LocalState
from shoal.train.model_dir_lock import ModelDirLock
from shoal.train.options import CheckpointOptions
from shoal.train.placement import Placement
from shoal.train.snapshot import gather

log = logging.getLogger("shoal.train.session")


class SaveReason(Enum):
    """Why a checkpoint is taken; its value is how the log line says it."""

    PERIODIC = "periodic"        # every_steps / every_s came round
    FINAL = "final"              # the session's `with` block ended without an error
    TERMINATED = "on SIGTERM"    # the process was asked to stop (shoal kill, deadline, preemption)
    REQUESTED = "requested"      # session.save_checkpoint()


class Checkpointer:
    """Saves checkpoints of the job's variables into `model_dir`, as `options` say.

    The constructor does no I/O. `open()` takes the model dir's lock (one job per model dir;
    ModelDirLockedError names the holder), `close()` releases it (idempotent).
    `mark_saved(step)` records the step the session started from, so the first periodic save
    comes one interval later. `local_state` (the chief's buffers) is saved and exported beside
    the variables, by its own names, with no shards.
    """

    def __init__(self, model_dir: Path, options: CheckpointOptions, placement: Placement, task: str,
                 local_state: LocalState | None = None):
        self.model_dir = model_dir
        self.options = options
        self._placement = placement
        self._task = task
        self._saved_step = -1
        self._saved_at = time.monotonic()
        self._lock = ModelDirLock(model_dir)
        self._local_state = local_state
        self.saves = 0
        """Checkpoints this process wrote (the progress line shows it)."""

    def open(self) -> None:
        """Take the model dir for this job. Raises ModelDirLockedError if another job has it."""
        self._lock.acquire()

    def close(self) -> None:
        self._lock.release()

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose checksums match, or None."""
        return load_latest_checkpoint(self.model_dir)

    def mark_saved(self, step: int) -> None:
        self._saved_step, self._saved_at = step, time.monotonic()

    def due(self, step: int) -> bool:
        """Whether a periodic checkpoint is due at global step `step`."""
        every_steps, every_s = self.options.every_steps, self.options.every_s
        if every_steps and step // every_steps > self._saved_step // every_steps:
            return True
        return bool(every_s) and time.monotonic() - self._saved_at >= every_s

    def save_if_due(self, client: PsClient, step: int) -> bool:
        """Take a periodic checkpoint if one is due; returns whether one was. A save that fails
        is logged as a warning and tried again at the next interval, so a full disk never stops
        training."""
        if not self.due(step):
            return False
        try:
            self.save(client, reason=SaveReason.PERIODIC)
        except CheckpointError as e:
            self.mark_saved(step)  # retry at the next interval, not on every step
            log.warning("%s could not save a periodic checkpoint (will try again in one interval): %s",
                        self._task, e)
        return True

    def use_placement(self, placement: Placement) -> None:
        """Gather snapshots by `placement` from now on (the job re-homed a ps: shoal/train/rehoming.py)."""
        self._placement = placement

    def save(self, client: PsClient, export: bool = False, reason: SaveReason = SaveReason.REQUESTED) -> Path:
        """Snapshot every ps (values, optimizer state, step) and write a checkpoint; with
        `export`, also the model alone. Returns the checkpoint's path. Raises CheckpointError."""
        lost = self._lock.lost()
        if lost:
            raise CheckpointWriteError(
                f"{self._task} writes no checkpoint to the model dir {self.model_dir}: {lost}, so this job no "
                "longer holds it and another job could take it; run the job again to have its checkpoints "
                "(in a model dir nothing removes: --model_dir / output_dir)")
        started = time.monotonic()
        # ps 0 (its lease book) and every ps that holds a shard: one that holds none has nothing
        # to save, and one of those that died would hold the save up until it is re-homed
        answers = client.snapshot_all(sorted({0, *(s.ps for s in self._placement.shards)}))
        variables, slots = gather(self._placement, [a.tensors for a in answers])
        if self._local_state is not None:
            variables.update(self._local_state.values())
        step = max(a.body.step for a in answers)
        layout: dict[str, list[dict]] = {}
        for s in self._placement.shards:
            layout.setdefault(s.variable, []).append({"name": s.name, "ps": s.ps, "start": s.start, "stop": s.stop})
        path = checkpoint_root(self.model_dir) / f"ckpt-{step:010d}"
        if step != self._saved_step or not path.is_dir():
            first = answers[0].body
            path = write_checkpoint(self.model_dir, step, variables, slots, optimizer=first.rule,
                                    mode=_mode_label(first.training), layout=layout, keep=self.options.keep,
                                    leases=first.leases)  # ps 0's lease book (the epoch and position)
            self.saves += 1
            log.log(logging.DEBUG if reason is SaveReason.PERIODIC else logging.INFO,
                    "%s saved checkpoint step=%d to %s (%.2fs, %s)", self._task, step, path,
                    time.monotonic() - started, reason.value)
        elif reason is not SaveReason.PERIODIC:  # (the last periodic save was of this very step)
            log.info("%s: checkpoint step=%d is in %s already (%s)", self._task, step, path, reason.value)
        self.mark_saved(step)
        if export:
            exported = export_model(self.model_dir / "export" / "model.safetensors", variables, step=step)
            log.info("%s exported the model to %s", self._task, exported)
        return path


def _mode_label(training) -> str:
    """How the manifest names the training mode ("async", "sync:N"), as in format 1."""
    return f"sync:{training.replicas}" if training.replicas else "async"
