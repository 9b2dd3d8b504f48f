"""TrainingSession: a worker's connection to the parameter servers (between-graph replication)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from shoal.cluster import ClusterConfig
from shoal.ps.optimizers import UpdateRule
from shoal.train.checkpoint import SLOT_SEPARATOR
from shoal.train.chief import ChiefDuties
from shoal.train.errors import TrainError
from shoal.train.placement import DEFAULT_MIN_SHARD_BYTES, Placement, PlacementStrategy, place_variables
from shoal.train.recovery import WaitsForTasks
from shoal.train.summaries import TaskSummaries
from shoal.wire import JobSecret, Message, PeerLostError, PeerTimeoutError, RemoteError, RpcClient, WireError, wait_all

log = logging.getLogger(__name__)


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
    applied: bool  # False when the ps dropped this gradient as stale (sync mode, backup workers)


class TrainingSession(ChiefDuties, WaitsForTasks):
    """Pulls parameters from and pushes gradients to the ps tasks of a cluster.

    The chief initializes the variables on the ps exactly once (from the newest checkpoint in
    `model_dir` when there is one); other workers wait for it (bounded by `init_timeout_s`,
    logging while they wait). Every request is bounded by `request_timeout_s`: a dead ps is a
    clear error, never a hang.

    With a `model_dir`, the chief saves checkpoints there (see CheckpointOptions) and every task
    writes TensorBoard summaries (`summaries`). If a ps task dies and is started again, the
    chief rebuilds its shards from the newest checkpoint and every worker resends what it lost;
    workers wait up to `ps_recovery_timeout_s` for that, then fail with a clear error.

    `params` holds this worker's current copy of every variable (writable numpy arrays, updated
    in place by `push` and `pull`). Calls block; not thread-safe. Use as a context manager
    (which also saves the final checkpoint when the block ends without an error), or call
    `start()` then `close()` (idempotent; tells the ps this worker is done).
    """

    def __init__(self, config: ClusterConfig, variables: Mapping[str, Any], optimizer: UpdateRule, *,
                 sync: bool | SyncOptions = False, max_steps: int | None = None, secret: JobSecret | None = None,
                 placement: PlacementStrategy = PlacementStrategy.GREEDY,
                 min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                 model_dir: str | os.PathLike | None = None, checkpoints: CheckpointOptions = CheckpointOptions(),
                 summary_every_steps: int = 100,
                 request_timeout_s: float = 60.0, init_timeout_s: float = 120.0, ps_recovery_timeout_s: float = 120.0):
        if config.task.job not in ("chief", "worker"):
            raise TrainError(f"{config.task} is not a training replica; only chief and worker tasks train "
                             "(ps tasks run shoal.Server)")
        bad = [name for name in variables if SLOT_SEPARATOR in name]
        if bad:
            raise TrainError(f"variable names may not contain {SLOT_SEPARATOR!r} (it marks optimizer state): {bad[:5]}")
        self.config = config
        self.task = str(config.task)
        self.params = {name: np.array(value, copy=True, order="C") for name, value in variables.items()}
        self.optimizer = optimizer
        self.sync = SyncOptions() if sync is True else (sync or None)
        self.replicas = self.sync and (self.sync.replicas_to_aggregate or config.num_replicas)
        if self.sync and not 1 <= self.replicas <= config.num_replicas:
            raise TrainError(f"replicas_to_aggregate={self.replicas} must be between 1 and the number of "
                             f"replicas ({config.num_replicas}: chief + workers)")
        self.max_steps = max_steps
        self.placement: Placement = place_variables(self.params, config.num_ps, placement, min_shard_bytes)
        self.model_dir = Path(model_dir) if model_dir else None
        self.checkpoints = checkpoints
        self.summaries: TaskSummaries | None = None
        if self.model_dir is not None:
            logdir = self.model_dir if config.is_chief else self.model_dir / f"{config.task.job}_{config.task.index}"
            self.summaries = TaskSummaries(logdir, every_steps=summary_every_steps, is_chief=config.is_chief)
        self.request_timeout_s = request_timeout_s
        self.init_timeout_s = init_timeout_s
        self.ps_recovery_timeout_s = ps_recovery_timeout_s
        self._secret = secret
        self._clients: list[RpcClient] = []
        self._incarnations: list[str | None] = [None] * config.num_ps
        self._names_on = [[s.name for s in self.placement.on_ps(i)] for i in range(config.num_ps)]
        self._targets = {s.name: self._target(s) for s in self.placement.shards}
        self._step = 0
        self._saved_step = -1
        self._saved_at = time.monotonic()
        self._closed = False

    def _target(self, s):
        value = self.params[s.variable]
        return value if value.ndim == 0 or (s.start == 0 and s.stop == len(value)) else value[s.start:s.stop]

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "TrainingSession":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None and self.config.is_chief and self.model_dir is not None:
                self.save_checkpoint(export=self.checkpoints.export)
        finally:
            self.close()

    def start(self) -> "TrainingSession":
        """Connect, initialize (chief) or wait for initialization (others), pull. Blocks."""
        secret = self._secret or JobSecret.from_environ(os.environ)
        self._clients = [RpcClient(addr, secret, f"ps:{i}", self.request_timeout_s)
                         for i, addr in enumerate(self.config.ps_addresses)]
        deadline = time.monotonic() + self.init_timeout_s
        statuses = self._wait_for_ps(deadline)
        if not all(s["ready"] for s in statuses):
            if self.config.is_chief:
                self._initialize()
            else:
                self._wait_for_chief(deadline)
        statuses = self._status_all(self.request_timeout_s)
        self._check_mode(statuses)
        self._incarnations = [s.get("incarnation") for s in statuses]
        self.pull()
        self._saved_step = self._step
        self._saved_at = time.monotonic()
        if self.summaries is not None:
            self.summaries.open()
        log.info("%s starts at global step %d (%s)", self.task, self.global_step,
                 f"sync, {self.replicas} of {self.config.num_replicas} replicas per step" if self.sync else "async")
        return self

    def close(self) -> None:
        """Tell every ps this worker is done, then disconnect. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        if self.summaries is not None:
            self.summaries.close()
        try:
            if self._clients:
                wait_all([(c, c.send("done", {"task": self.task})) for c in self._clients], 5.0)
        except WireError as e:
            log.debug("%s: could not tell every ps it is done: %s", self.task, e)
        for c in self._clients:
            c.close()

    def end_job(self) -> None:
        """Stop every ps now, even if other workers have not finished (chief only, usually)."""
        try:
            wait_all([(c, c.send("shutdown", {"task": self.task})) for c in self._clients], 5.0)
        finally:
            self.close()

    # -- training --------------------------------------------------------------------------

    @property
    def global_step(self) -> int:
        return self._step

    def should_stop(self) -> bool:
        return self.max_steps is not None and self._step >= self.max_steps

    def push(self, grads: Mapping[str, np.ndarray]) -> StepResult:
        """Send one gradient per variable; on return `params` holds the updated values.

        Async: the ps applies it at once. Sync: returns once the step's aggregate is applied
        (or at once, with applied=False, if the gradient was stale). The chief also saves a
        checkpoint here when one is due. Blocks.
        """
        if grads.keys() != self.params.keys():
            missing, extra = self.params.keys() - grads.keys(), grads.keys() - self.params.keys()
            raise TrainError(f"gradients must match the variables: missing {sorted(missing)}, unknown {sorted(extra)}")
        arrays = {name: np.require(g, dtype=self.params[name].dtype, requirements="C") for name, g in grads.items()}
        for name, g in arrays.items():
            if g.shape != self.params[name].shape:
                raise TrainError(f"gradient of {name!r} has shape {g.shape}, the variable has {self.params[name].shape}")
        per_ps = self.placement.split(arrays)
        fields = {"task": self.task, "step": self._step}
        replies = self._request_all([(i, "push", fields, per_ps[i]) for i in range(len(self._clients))],
                                    into=self._targets)
        self._assign(replies)
        steps = [r.header["step"] for r in replies]
        if self.sync and len(set(steps)) > 1:
            self.pull(min_step=max(steps))  # a stale push met ps tasks at different steps: realign
        else:
            self._step = max(steps) if self.sync else steps[0]
        result = StepResult(self._step, all(r.header.get("outcome") == "applied" for r in replies))
        self._after_step()
        return result

    def run_step(self, loss_and_grad: Callable[..., tuple[float, Mapping[str, np.ndarray]]], *batch) -> tuple[float, StepResult]:
        """Compute `loss, grads = loss_and_grad(params, *batch)` and push the gradients. Blocks."""
        loss, grads = loss_and_grad(self.params, *batch)
        return loss, self.push(grads)

    def pull(self, min_step: int = 0) -> int:
        """Refresh `params` from the ps (waiting until every ps reached `min_step`). Blocks.

        In sync mode, if the ps tasks answer from different steps (one just finished a step),
        pulls again at the newest, so every worker starts a step from the same parameters.
        """
        replies = self._request_all([(i, "pull", {"names": self._names_on[i], "min_step": min_step}, None)
                                     for i in range(len(self._clients))], into=self._targets)
        self._assign(replies)
        steps = [r.header["step"] for r in replies]
        if self.sync and len(set(steps)) > 1:
            return self.pull(max(steps))
        self._step = max(steps) if self.sync else steps[0]
        return self._step

    def _after_step(self) -> None:
        if self.summaries is not None:
            self.summaries.step_done(self._step, getattr(self.optimizer, "learning_rate", None))
        if self.config.is_chief and self.model_dir is not None and self._checkpoint_due():
            self.save_checkpoint()

    # -- internals -------------------------------------------------------------------------

    def _request_all(self, requests: list[tuple[int, str, dict, Mapping[str, np.ndarray] | None]],
                     into: Mapping[str, np.ndarray] | None = None) -> list[Message]:
        """Send (ps, op, fields, tensors) requests and wait for every reply; reply tensors named
        in `into` land in those arrays directly. If a ps is lost (or restarted) meanwhile,
        recover it and resend what went to it. Blocks."""
        rids = [self._clients[ps].send(op, fields, tensors, into) for ps, op, fields, tensors in requests]
        deadline = None
        while True:
            try:
                return wait_all([(self._clients[r[0]], rid) for r, rid in zip(requests, rids)], self.request_timeout_s)
            except PeerTimeoutError as e:
                hint = (f" In sync mode a step waits for {self.replicas} replicas: if a worker is down, use backup "
                        "workers (replicas_to_aggregate < replicas)." if self.sync else "")
                raise TrainError(f"{self.task}: {e}.{hint}") from e
            except (PeerLostError, RemoteError) as e:
                lost = self._ps_index(e.peer_name)
                if lost is None or self._incarnations[lost] is None or (
                        isinstance(e, RemoteError) and not self._restarted(lost)):
                    raise
                deadline = deadline or time.monotonic() + self.ps_recovery_timeout_s
                self._recover_ps(lost, deadline, e)
                for k, (ps, op, fields, tensors) in enumerate(requests):
                    if ps == lost:
                        rids[k] = self._clients[ps].send(op, fields, tensors, into)

    def _ps_index(self, peer_name: str) -> int | None:
        for i, c in enumerate(self._clients):
            if c.peer_name == peer_name:
                return i
        return None

    def _assign(self, replies: list[Message]) -> None:
        for reply in replies:
            for name, value in reply.tensors.items():
                target = self._targets.get(name)
                if target is None or target.shape != value.shape:
                    raise TrainError(f"a ps sent {name!r} with shape {value.shape}, which this worker does not hold")
                if value is not target:  # not already decoded into place
                    np.copyto(target, value)

    def _status_all(self, timeout_s: float) -> list[dict]:
        return [m.header for m in wait_all([(c, c.send("status")) for c in self._clients], timeout_s)]

    def _check_mode(self, statuses: list[dict]) -> None:
        want = f"sync:{self.replicas}" if self.sync else "async"
        for i, s in enumerate(statuses):
            if s["mode"] != want:
                raise TrainError(f"{self.task} was started for {want} training but ps:{i} runs {s['mode']}; "
                                 "start every worker with the same --sync / replicas_to_aggregate")
