"""The chief's duties on top of TrainingSession: initialize or restore the ps, save checkpoints,
export the model, and rebuild a ps task that restarted.

A mixin of TrainingSession (it uses the session's clients, placement and options); every call
blocks and none is thread-safe.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from shoal.train.checkpoint import checkpoint_root, export_model, load_latest_checkpoint, save_checkpoint
from shoal.train.errors import TrainError
from shoal.train.snapshot import check_fits, gather, scatter
from shoal.wire import WireError

log = logging.getLogger("shoal.train.session")


class ChiefDuties:
    """Initialize/restore, checkpoint, export and rebuild: what only the chief does."""

    def save_checkpoint(self, export: bool = False) -> Path:
        """Snapshot every ps (values, optimizer state, step) and write a checkpoint to the
        model directory (chief only). Returns its path. Blocks; other workers keep training."""
        if self.model_dir is None:
            raise TrainError(f"{self.task}: no model_dir to save a checkpoint to; pass model_dir (--model_dir)")
        started = time.monotonic()
        replies = self._request_all([(i, "snapshot", {}, None) for i in range(len(self._clients))])
        variables, slots = gather(self.placement, [r.tensors for r in replies])
        step = max(r.header["step"] for r in replies)
        layout = {}
        for s in self.placement.shards:
            layout.setdefault(s.variable, []).append({"name": s.name, "ps": s.ps, "start": s.start, "stop": s.stop})
        path = checkpoint_root(self.model_dir) / f"ckpt-{step:010d}"
        if step != self._saved_step or not path.is_dir():
            path = save_checkpoint(self.model_dir, step, variables, slots, optimizer=replies[0].header["rule"],
                                   mode=replies[0].header["mode"], layout=layout, keep=self.checkpoints.keep)
            log.info("%s saved checkpoint step=%d to %s (%.2fs)", self.task, step, path, time.monotonic() - started)
        self._saved_step, self._saved_at = step, time.monotonic()
        if export:
            exported = export_model(self.model_dir / "export" / "model.safetensors", variables, step=step)
            log.info("%s exported the model to %s", self.task, exported)
        return path

    def _checkpoint_due(self) -> bool:
        every_steps, every_s = self.checkpoints.every_steps, self.checkpoints.every_s
        if every_steps and self._step // every_steps > self._saved_step // every_steps:
            return True
        return bool(every_s) and time.monotonic() - self._saved_at >= every_s

    def _restore_source(self, what: str) -> tuple[dict[str, np.ndarray], dict, int | None]:
        """Values, optimizer slots and step to (re)create shards from: the newest valid
        checkpoint in model_dir, else this task's own variables (and fresh slots, step None)."""
        checkpoint = load_latest_checkpoint(self.model_dir) if self.model_dir is not None else None
        if checkpoint is None:
            return self.params, {}, None
        check_fits(self.params, checkpoint.variables, str(checkpoint.path))
        slots = checkpoint.slots
        if checkpoint.optimizer.get("name") != self.optimizer.name:
            log.warning("the checkpoint was trained with %s, this job uses %s: the optimizer state starts fresh",
                        checkpoint.optimizer.get("name"), self.optimizer.name)
            slots = {}
        log.info("restored checkpoint step=%d from %s (%s)", checkpoint.step, checkpoint.path, what)
        return checkpoint.variables, slots, checkpoint.step

    def _init_fields(self, step: int, done: list[str] | None = None) -> dict:
        """The `init` request's fields: update rule, sync mode, starting step, finished tasks."""
        return {"rule": self.optimizer.to_config(), "sync_replicas": self.replicas or None, "step": step,
                "done": done or []}

    def _initialize(self) -> None:
        values, slots, step = self._restore_source("initializing the job")
        fields = self._init_fields(step or 0)
        tensors = scatter(self.placement, values, slots)
        replies = self._request_all([(i, "init", fields, tensors[i]) for i in range(len(self._clients))])
        created = sum(r.header["created"] for r in replies)
        self._request_all([(i, "ready", {}, None) for i in range(len(self._clients))])
        log.info("%s initialized %d variables (%d shards) on %d ps", self.task, len(self.params), created,
                 len(self._clients))

    def _rebuild_ps(self, ps: int) -> None:
        """Chief: recreate a restarted ps's shards from the newest checkpoint (else from this
        task's current copy), at the step the other ps tasks are at."""
        others = []
        for i, c in enumerate(self._clients):
            if i != ps:
                try:
                    others.append(c.call("status", timeout_s=2.0).header)
                except WireError:
                    pass
        values, slots, saved_step = self._restore_source(f"for ps:{ps}, which restarted")
        if saved_step is None:
            log.warning("%s: no checkpoint in model_dir; rebuilding ps:%d from this task's copy of its variables "
                        "(its optimizer state starts fresh)", self.task, ps)
        step = max([s["step"] for s in others] + [saved_step or 0, self._step])
        done = sorted({t for s in others for t in s.get("done", [])})
        tensors = scatter(self.placement, values, slots, only_ps=ps)[ps]
        fields = self._init_fields(step, done)
        client = self._clients[ps]
        client.call("init", fields, tensors, timeout_s=self.request_timeout_s)
        client.call("ready", timeout_s=self.request_timeout_s)
        log.info("%s rebuilt ps:%d at step %d", self.task, ps, step)
