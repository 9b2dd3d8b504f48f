"""What a TrainingSession is asked to do, and what a step returns: small frozen values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class SyncOptions:
    """Synchronous training: each global step averages `replicas_to_aggregate` gradients
    (default: every replica). With fewer than the number of replicas, the rest are backup
    workers whose late gradients are dropped as stale."""

    replicas_to_aggregate: int | None = None


@dataclass(frozen=True)
class CheckpointOptions:
    """When the chief saves a checkpoint into the model directory: every `every_steps` global
    steps and/or every `every_s` seconds (None turns either off), and always when the session
    ends without an error. The newest `keep` are kept. `export` also writes the final variables
    to `<model_dir>/export/model.safetensors`, loadable without Shoal."""

    every_steps: int | None = None
    every_s: float | None = 600.0
    keep: int = 5
    export: bool = True


@dataclass(frozen=True)
class StepResult:
    global_step: int
    # False when the ps dropped this gradient as stale (sync mode, backup workers); None when not
    # known yet (the first push of an overlapped session: shoal/train/push_overlap.py)
    applied: bool | None


class SessionState(Enum):
    """Where a TrainingSession is in its life.

    NEW -> STARTED (`start`, or entering `with`) -> CLOSED (`close`, or leaving `with`);
    NEW -> CLOSED. A failed `start` leaves it NEW (start may be tried again). Only a STARTED
    session pulls, pushes and saves; CLOSED is final.
    """

    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"
