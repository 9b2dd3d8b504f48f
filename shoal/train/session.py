"""TrainingSession: a worker's connection to the parameter servers (between-graph replication)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from shoal.cluster import ClusterConfig
from shoal.ps.optimizers import UpdateRule
from shoal.train.errors import TrainError
from shoal.train.placement import DEFAULT_MIN_SHARD_BYTES, Placement, PlacementStrategy, place_variables
from shoal.wire import JobSecret, Message, PeerTimeoutError, RpcClient, WireError, wait_all

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncOptions:
    """Synchronous training: each global step averages `replicas_to_aggregate` gradients
    (default: every replica). With fewer than the number of replicas, the rest are backup
    workers whose late gradients are dropped as stale."""

    replicas_to_aggregate: int | None = None


@dataclass(frozen=True)
class StepResult:
    global_step: int
    applied: bool  # False when the ps dropped this gradient as stale (sync mode, backup workers)


class TrainingSession:
    """Pulls parameters from and pushes gradients to the ps tasks of a cluster.

    The chief initializes the variables on the ps exactly once; other workers wait for it
    (bounded by `init_timeout_s`, logging while they wait). Every request is bounded by
    `request_timeout_s`: a dead ps is a clear error, never a hang.

    `params` holds this worker's current copy of every variable (writable numpy arrays, updated
    in place by `push` and `pull`). Calls block; not thread-safe. Use as a context manager, or
    call `start()` then `close()` (idempotent; tells the ps this worker is done).
    """

    def __init__(self, config: ClusterConfig, variables: Mapping[str, Any], optimizer: UpdateRule, *,
                 sync: bool | SyncOptions = False, max_steps: int | None = None, secret: JobSecret | None = None,
                 placement: PlacementStrategy = PlacementStrategy.GREEDY,
                 min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                 request_timeout_s: float = 60.0, init_timeout_s: float = 120.0):
        if config.task.job not in ("chief", "worker"):
            raise TrainError(f"{config.task} is not a training replica; only chief and worker tasks train "
                             "(ps tasks run shoal.Server)")
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
        self.request_timeout_s = request_timeout_s
        self.init_timeout_s = init_timeout_s
        self._secret = secret
        self._clients: list[RpcClient] = []
        self._names_on = [[s.name for s in self.placement.on_ps(i)] for i in range(config.num_ps)]
        self._targets = {s.name: self._target(s) for s in self.placement.shards}
        self._step = 0
        self._closed = False

    def _target(self, s):
        value = self.params[s.variable]
        return value if value.ndim == 0 or (s.start == 0 and s.stop == len(value)) else value[s.start:s.stop]

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "TrainingSession":
        return self.start()

    def __exit__(self, *exc) -> None:
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
                statuses = self._wait_for_chief(deadline)
        self._check_mode(self._status_all(self.request_timeout_s))
        self.pull()
        log.info("%s starts at global step %d (%s)", self.task, self.global_step,
                 f"sync, {self.replicas} of {self.config.num_replicas} replicas per step" if self.sync else "async")
        return self

    def close(self) -> None:
        """Tell every ps this worker is done, then disconnect. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
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
        (or at once, with applied=False, if the gradient was stale). Blocks.
        """
        if grads.keys() != self.params.keys():
            missing, extra = self.params.keys() - grads.keys(), grads.keys() - self.params.keys()
            raise TrainError(f"gradients must match the variables: missing {sorted(missing)}, unknown {sorted(extra)}")
        arrays = {name: np.ascontiguousarray(g, dtype=self.params[name].dtype) for name, g in grads.items()}
        for name, g in arrays.items():
            if g.shape != self.params[name].shape:
                raise TrainError(f"gradient of {name!r} has shape {g.shape}, the variable has {self.params[name].shape}")
        per_ps = self.placement.split(arrays)
        fields = {"task": self.task, "step": self._step}
        replies = self._call_all([(c, c.send("push", fields, per_ps[i])) for i, c in enumerate(self._clients)])
        self._assign(replies)
        steps = [r.header["step"] for r in replies]
        if self.sync and len(set(steps)) > 1:
            self.pull(min_step=max(steps))  # a stale push met ps tasks at different steps: realign
        else:
            self._step = max(steps) if self.sync else steps[0]
        return StepResult(self._step, all(r.header.get("outcome") == "applied" for r in replies))

    def run_step(self, loss_and_grad: Callable[..., tuple[float, Mapping[str, np.ndarray]]], *batch) -> tuple[float, StepResult]:
        """Compute `loss, grads = loss_and_grad(params, *batch)` and push the gradients. Blocks."""
        loss, grads = loss_and_grad(self.params, *batch)
        return loss, self.push(grads)

    def pull(self, min_step: int = 0) -> int:
        """Refresh `params` from the ps (waiting until every ps reached `min_step`). Blocks.

        In sync mode, if the ps tasks answer from different steps (one just finished a step),
        pulls again at the newest, so every worker starts a step from the same parameters.
        """
        replies = self._call_all([(c, c.send("pull", {"names": self._names_on[i], "min_step": min_step}))
                                  for i, c in enumerate(self._clients)])
        self._assign(replies)
        steps = [r.header["step"] for r in replies]
        if self.sync and len(set(steps)) > 1:
            return self.pull(max(steps))
        self._step = max(steps) if self.sync else steps[0]
        return self._step

    # -- internals -------------------------------------------------------------------------

    def _call_all(self, pending) -> list[Message]:
        try:
            return wait_all(pending, self.request_timeout_s)
        except PeerTimeoutError as e:
            hint = (f" In sync mode a step waits for {self.replicas} replicas: if a worker is down, use backup "
                    "workers (replicas_to_aggregate < replicas)." if self.sync else "")
            raise TrainError(f"{self.task}: {e}.{hint}") from e

    def _assign(self, replies: list[Message]) -> None:
        for reply in replies:
            for name, value in reply.tensors.items():
                target = self._targets.get(name)
                if target is None or target.shape != value.shape:
                    raise TrainError(f"a ps sent {name!r} with shape {value.shape}, which this worker does not hold")
                np.copyto(target, value)

    def _status_all(self, timeout_s: float) -> list[dict]:
        return [m.header for m in wait_all([(c, c.send("status")) for c in self._clients], timeout_s)]

    def _wait_for_ps(self, deadline: float) -> list[dict]:
        """Poll every ps until all answer. Logs who is missing every 10 s."""
        started, last_log = time.monotonic(), 0.0
        while True:
            try:
                return self._status_all(min(2.0, max(0.1, deadline - time.monotonic())))
            except PeerTimeoutError as e:
                now = time.monotonic()
                if now >= deadline:
                    raise TrainError(f"{self.task}: parameter servers did not come up within "
                                     f"{self.init_timeout_s:.0f}s ({e}); start the ps tasks or fix --ps_hosts") from e
                if now - last_log > 10:
                    log.info("%s waiting for parameter servers (%s) (%.0fs of %.0fs)", self.task,
                             ", ".join(self.config.ps_addresses), now - started, self.init_timeout_s)
                    last_log = now

    def _wait_for_chief(self, deadline: float) -> list[dict]:
        chief = self.config.chief_task
        started, last_log = time.monotonic(), time.monotonic()
        log.info("%s waiting for the chief (%s) to initialize the variables", self.task, chief)
        while True:
            statuses = self._status_all(self.request_timeout_s)
            if all(s["ready"] for s in statuses):
                return statuses
            now = time.monotonic()
            if now >= deadline:
                raise TrainError(f"{self.task}: the chief ({chief}) did not initialize the variables within "
                                 f"{self.init_timeout_s:.0f}s; is it running? (raise init_timeout_s if it is slow)")
            if now - last_log > 10:
                log.info("%s still waiting for the chief (%s) (%.0fs of %.0fs)", self.task, chief,
                         now - started, self.init_timeout_s)
                last_log = now
            time.sleep(0.2)

    def _initialize(self) -> None:
        values = self.placement.split(self.params)
        fields = {"rule": self.optimizer.to_config(), "sync_replicas": self.replicas or None}
        replies = self._call_all([(c, c.send("init", fields, values[i])) for i, c in enumerate(self._clients)])
        created = sum(r.header["created"] for r in replies)
        self._call_all([(c, c.send("ready")) for c in self._clients])
        log.info("%s initialized %d variables (%d shards) on %d ps", self.task, len(self.params), created,
                 len(self._clients))

    def _check_mode(self, statuses: list[dict]) -> None:
        want = f"sync:{self.replicas}" if self.sync else "async"
        for i, s in enumerate(statuses):
            if s["mode"] != want:
                raise TrainError(f"{self.task} was started for {want} training but ps:{i} runs {s['mode']}; "
                                 "start every worker with the same --sync / replicas_to_aggregate")
