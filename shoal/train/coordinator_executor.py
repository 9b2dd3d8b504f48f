"""`StepExecutor`: what a worker does with each coordinator request, without a socket.

`handle` decodes a request with its op's type, runs it against the worker's `WorkerContext`
and returns the reply to send (its typed body and tensors). A malformed request, an unknown
step or dataset, raises a CoordinatorError (the service answers it as an error reply and keeps
serving); a step that raises is a RAISED reply with the traceback's last line.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from shoal.cluster import ClusterConfig
from shoal.train.coordinator_errors import BadValueError, CoordinatorError
from shoal.train.coordinator_protocol import (REQUEST_TYPES, CoordOp, DatasetRequest, Empty, HelloReply,
                                              RunOutcome, RunReply, RunRequest, parse_op)
from shoal.train.coordinator_registry import StepRegistry
from shoal.train.coordinator_values import decode_values, encode_values

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerContext:
    """What a step or dataset function gets first: this worker's task name, its cluster config,
    its TrainingSession (None if the program gave none) and its data shard among the job's
    executing workers (`shard_index` of `num_shards`)."""

    task: str
    config: ClusterConfig
    session: Any
    shard_index: int
    num_shards: int


def executor_tasks(config: ClusterConfig) -> list:
    """The tasks that execute steps: every training replica but the chief (the coordinator)."""
    return [t for t in config.replica_tasks if t != config.chief_task]


def worker_context(config: ClusterConfig, session: Any) -> WorkerContext:
    executors = executor_tasks(config)
    if config.task not in executors:
        raise CoordinatorError(f"{config.task} does not execute steps: the chief ({config.chief_task}) "
                               "coordinates; only the other chief and worker tasks serve steps")
    return WorkerContext(str(config.task), config, session, executors.index(config.task), len(executors))


@dataclass(frozen=True)
class Outgoing:
    """A reply to send: its typed body and the tensors that travel with it."""

    body: Any
    tensors: Mapping[str, np.ndarray] | None = None


class StepExecutor:
    """Runs registered steps for one worker. Not thread-safe (the serving thread only); no I/O
    of its own (the steps do theirs). `finished` turns True on `finish`."""

    def __init__(self, context: WorkerContext, registry: StepRegistry):
        self.context = context
        self.registry = registry
        self.finished = False
        self.runs = 0
        self._datasets: dict[int, Iterator] = {}

    def handle(self, op_name: Any, fields: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Outgoing:
        """The reply to one request. Raises CoordinatorError for a request it cannot run."""
        op = parse_op(op_name)
        request = REQUEST_TYPES[op].decode(fields)
        if op is CoordOp.HELLO:
            return Outgoing(HelloReply(self.context.task, self.registry.step_names(), self.registry.dataset_names(),
                                       tuple(sorted(self._datasets))))
        if op is CoordOp.DATASET:
            return self._dataset(request, tensors)
        if op is CoordOp.RUN:
            return self._run(request, tensors)
        self.finished = True
        return Outgoing(Empty())

    def _dataset(self, request: DatasetRequest, tensors: Mapping[str, np.ndarray]) -> Outgoing:
        fn = self.registry.get_dataset(request.fn)
        args = decode_values(request.args, tensors, where="dataset args")
        if not isinstance(args, list):
            raise BadValueError(f"dataset args must be a list, got {type(args).__name__}")
        self._datasets[request.dataset_id] = iter(fn(self.context, *args))
        log.info("%s created dataset %d from %r", self.context.task, request.dataset_id, request.fn)
        return Outgoing(Empty())

    def _run(self, request: RunRequest, tensors: Mapping[str, np.ndarray]) -> Outgoing:
        fn = self.registry.get_step(request.fn)
        args = decode_values(request.args, tensors, self._dataset_of, where="step args")
        if not isinstance(args, list):
            raise BadValueError(f"step args must be a list, got {type(args).__name__}")
        try:
            result = None
            with self._tagging(request.closure_key):
                for _ in range(request.steps):
                    result = fn(self.context, *args)
            self.runs += 1
            tree, out = encode_values(result, prefix="r")
        except Exception as e:
            text = traceback.format_exc()
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            log.warning("%s: step %r (closure %d) raised %s", self.context.task, request.fn, request.closure, last)
            return Outgoing(RunReply(RunOutcome.RAISED, error=last, traceback=text))
        return Outgoing(RunReply(RunOutcome.RETURNED, tree), out)

    def _tagging(self, closure_key: str):
        """The session's pushes in this block carry the closure's id (the ps applies them once,
        even if the closure runs again elsewhere); nothing to tag without a session."""
        tag = getattr(self.context.session, "closure", None)
        return tag(closure_key) if callable(tag) else contextlib.nullcontext()

    def _dataset_of(self, dataset_id: int) -> Iterator:
        it = self._datasets.get(dataset_id)
        if it is None:
            raise CoordinatorError(f"{self.context.task} has no dataset {dataset_id}; create it with "
                                   "Coordinator.create_per_worker_dataset before scheduling steps that use it")
        return it
