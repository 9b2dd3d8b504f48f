"""The parameter-server protocol: what each op does to the shards. See docs/wire-protocol.md.

Ops (request field -> reply field; tensors travel as frames):

    status                       -> ready, step, mode, shards, bytes, created, done, incarnation
    init   rule, sync_replicas, step, done
           (tensors: initial values, and "<shard>@<slot>" optimizer state from a checkpoint) -> created
    snapshot                     -> step, mode, rule (tensors: copies of values and "<shard>@<slot>")
    ready                        -> ready
    pull   names, min_step       -> step (tensors: values); waits until step >= min_step
    push   task, step, pull      (tensors: gradients) -> step, outcome (tensors: new values)
    done   task                  -> done (the job ends when every replica said done)
    shutdown                     -> (the job ends now)
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from shoal.ps.errors import PsError
from shoal.ps.optimizers import rule_from_config
from shoal.ps.store import ShardStore
from shoal.ps.sync import PushOutcome, SyncAggregator
from shoal.wire import Request, RpcServer

log = logging.getLogger(__name__)

_BUFFERED_BYTES = 256 << 10  # smaller gradients are decoded without a copy (np.frombuffer)


@dataclass
class _Waiting:
    request: Request
    names: list[str]
    min_step: int
    outcome: str | None = None


class PsService:
    """Handles requests for one ps task. Runs on the serving thread only (not thread-safe).

    `on_job_over` is called once, when every replica said `done` or someone said `shutdown`.
    """

    def __init__(self, task_name: str, num_replicas: int, on_job_over: Callable[[str], None]):
        self.task_name = task_name
        self.num_replicas = num_replicas
        self.store = ShardStore(task_name)
        self.rpc: RpcServer | None = None
        self._on_job_over = on_job_over
        self._ready = False
        self._sync: SyncAggregator | None = None
        self._async_step = 0
        self._created = 0
        self._done: set[str] = set()
        self._waiting: list[_Waiting] = []
        self.incarnation = secrets.token_hex(8)  # tells workers this process is new after a restart

    @property
    def step(self) -> int:
        return self._sync.step if self._sync is not None else self._async_step

    @property
    def mode(self) -> str:
        if self.store.rule is None:
            return "uninitialized"
        return f"sync:{self._sync.replicas}" if self._sync is not None else "async"

    def tensor_destination(self, header: dict, name: str, dtype, shape) -> np.ndarray | None:
        """Where a push's large gradient is received: the shard's reusable buffer, so a big
        push does not allocate (and page-fault in) a fresh array every step."""
        if header.get("op") != "push" or math.prod(shape) * dtype.itemsize < _BUFFERED_BYTES:
            return None
        return self.store.gradient_buffer(name, dtype, shape)

    def handle(self, request: Request) -> None:
        op = getattr(self, f"_op_{request.op}", None)
        if op is None:
            raise PsError(f"unknown op {request.op!r:.50}; this ps speaks status, init, snapshot, ready, pull, push, "
                          "done, shutdown (is the peer a Shoal worker of the same version?)")
        op(request)

    def _op_status(self, request: Request) -> None:
        self.rpc.reply(request, {"ready": self._ready, "step": self.step, "mode": self.mode,
                                 "shards": len(self.store), "bytes": self.store.nbytes,
                                 "created": self._created, "done": sorted(self._done),
                                 "incarnation": self.incarnation})

    def _op_init(self, request: Request) -> None:
        rule = rule_from_config(request.header.get("rule"))
        replicas = _optional_int(request.header, "sync_replicas", minimum=1)
        wanted = f"sync:{replicas}" if replicas else "async"
        if self.store.rule is not None and wanted != self.mode:
            raise PsError(f"{self.task_name} already runs {self.mode} training, a worker asked for {wanted}; "
                          "start every worker with the same --sync setting")
        step = _optional_int(request.header, "step", minimum=0)
        done = request.header.get("done") or []
        if not isinstance(done, list) or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in done):
            raise PsError(f"field 'done' must list task names, got {done!r:.100}")
        values, slots = _split_slots(request.tensors)
        first = self.store.rule is None
        self._created += self.store.create(values, rule, slots)
        if replicas and self._sync is None:
            self._sync = SyncAggregator(replicas)
        if first and step:  # restored from a checkpoint, or rebuilt after this ps restarted
            if self._sync is not None:
                self._sync.step = step
            else:
                self._async_step = step
        self._done.update(done)
        log.info("%s holds %d shards (%.1f MB), %s, %s", self.task_name, len(self.store),
                 self.store.nbytes / 1e6, rule.to_config(), self.mode)
        self.rpc.reply(request, {"created": self._created})

    def _op_snapshot(self, request: Request) -> None:
        if self.store.rule is None:
            raise PsError(f"{self.task_name} has no variables to snapshot yet (not initialized)")
        self.rpc.reply(request, {"step": self.step, "mode": self.mode, "rule": self.store.rule.to_config()},
                       self.store.snapshot())

    def _op_ready(self, request: Request) -> None:
        if self.store.rule is None:
            raise PsError(f"{self.task_name} got 'ready' before 'init'")
        self._ready = True
        self.rpc.reply(request, {"ready": True})

    def _op_pull(self, request: Request) -> None:
        names = _names(request.header)
        for name in names:
            self.store.check_name(name)
        min_step = _optional_int(request.header, "min_step", minimum=0) or 0
        self._answer_or_wait(_Waiting(request, names, min_step))

    def _op_push(self, request: Request) -> None:
        if not self._ready:
            raise PsError(f"{self.task_name} is not initialized yet; wait for the chief before pushing")
        task = _task(request.header)
        worker_step = _optional_int(request.header, "step", minimum=0) or 0
        grads = request.tensors
        for name, grad in grads.items():
            self.store.check(name, grad.shape, grad.dtype)
        names = list(grads) if request.header.get("pull", True) else []
        if self._sync is None:
            self.store.apply(grads)
            self._async_step += 1
            self._answer(_Waiting(request, names, 0, PushOutcome.APPLIED.value))
            return
        if worker_step > self._sync.step:
            raise PsError(f"{task} pushed for step {worker_step} but {self.task_name} is at step "
                          f"{self._sync.step}; pull before pushing")
        outcome = self._sync.add(task, worker_step, grads)
        if outcome in (PushOutcome.STALE, PushOutcome.DUPLICATE):
            self._answer(_Waiting(request, names, 0, outcome.value))
            return
        self._waiting.append(_Waiting(request, names, worker_step + 1, PushOutcome.APPLIED.value))
        if outcome is PushOutcome.APPLIED:
            self.store.apply(self._sync.take())
            self._release()

    def _op_done(self, request: Request) -> None:
        self._done.add(_task(request.header))
        self.rpc.reply(request, {"done": len(self._done)})
        if len(self._done) >= self.num_replicas:
            self._on_job_over(f"all {self.num_replicas} workers finished")

    def _op_shutdown(self, request: Request) -> None:
        self.rpc.reply(request, {})
        self._on_job_over(f"{_task(request.header)} ended the job")

    def _answer_or_wait(self, waiting: _Waiting) -> None:
        if self.step >= waiting.min_step:
            self._answer(waiting)
        else:
            self._waiting.append(waiting)

    def _release(self) -> None:
        """Answer every waiting request whose step has come."""
        still = []
        for w in self._waiting:
            if self.step >= w.min_step:
                self._answer(w)
            else:
                still.append(w)
        self._waiting = still

    def _answer(self, w: _Waiting) -> None:
        fields: dict[str, Any] = {"step": self.step}
        if w.outcome is not None:
            fields["outcome"] = w.outcome
        values = self.store.values(w.names)
        tracker = self.rpc.reply(w.request, fields, values, track=True)
        self.store.track(w.names, tracker)


def _split_slots(tensors: dict) -> tuple[dict, dict]:
    """Tensors named "<shard>@<slot>" are optimizer state; the rest are shard values."""
    values, slots = {}, {}
    for name, value in tensors.items():
        shard, sep, slot = name.rpartition("@")
        if sep:
            slots.setdefault(shard, {})[slot] = value
        else:
            values[name] = value
    return values, slots


def _optional_int(header: dict, key: str, minimum: int) -> int | None:
    value = header.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PsError(f"field {key!r} must be an int >= {minimum}, got {value!r:.50}")
    return value


def _names(header: dict) -> list[str]:
    names = header.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise PsError(f"field 'names' must be a list of variable names, got {names!r:.100}")
    return names


def _task(header: dict) -> str:
    task = header.get("task")
    if not isinstance(task, str) or not 0 < len(task) <= 64:
        raise PsError(f"field 'task' must name the sending task (e.g. 'worker:1'), got {task!r:.80}")
    return task
