"""`serve_steps`: a worker task under a coordinator (in-graph replication) serves step requests
on its own cluster address until the coordinator says `finish`.

The worker keeps its own TrainingSession (pulling from and pushing to the ps as in
between-graph training); the coordinator only says which registered step to run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from shoal.cluster import ClusterConfig
from shoal.errors import ShoalError
from shoal.logs_default import show_shoal_logs
from shoal.train.coordinator_errors import CoordinatorError
from shoal.train.coordinator_executor import StepExecutor, worker_context
from shoal.train.coordinator_registry import StepRegistry
from shoal.train.session import TrainingSession
from shoal.wire import JobSecret, Request, RpcServer, Security

log = logging.getLogger(__name__)


class StepService:
    """Serves one worker's StepExecutor on its cluster address (authenticated with the job
    secret, as the ps is). `start()` binds (BindError if the port is taken); `serve(idle_timeout_s)`
    blocks until `finish` or until no request came for `idle_timeout_s` (a coordinator that went
    away; raises CoordinatorError). `close()` is idempotent. Not thread-safe: one thread."""

    def __init__(self, config: ClusterConfig, registry: StepRegistry, session: Any, *, secret: JobSecret,
                 security: Security = Security.AUTO):
        self.config = config
        self.executor = StepExecutor(worker_context(config, session), registry)
        self._session = session
        self.address = config.cluster.task_address(config.task.job, config.task.index)
        self._rpc = RpcServer(self.address, secret, self._handle, f"{config.task} (steps)", security=security)
        self._started = False
        self._last_request = time.monotonic()

    def start(self) -> "StepService":
        if not self._started:
            show_shoal_logs()
            self._rpc.start()
            self._started = True
            log.info("%s serving steps at %s for the coordinator (%s)", self.config.task, self.address,
                     self.config.chief_task)
        return self

    def serve(self, idle_timeout_s: float | None = 600.0) -> None:
        """Handle requests until the coordinator says finish. Blocks."""
        self.start()
        self._last_request = time.monotonic()
        stop_if_terminated = getattr(self._session, "stop_if_terminated", None)
        while not self.executor.finished:
            if stop_if_terminated is not None:
                stop_if_terminated()  # SIGTERM while idle here: leave now, as a push would
            if not self._rpc.serve_once(200) and idle_timeout_s is not None:
                if time.monotonic() - self._last_request > idle_timeout_s:
                    raise CoordinatorError(f"{self.config.task} heard nothing from the coordinator "
                                           f"({self.config.chief_task}) for {idle_timeout_s:.0f}s; is it still "
                                           "running? (raise idle_timeout_s for longer pauses)")
        log.info("%s: the coordinator finished training (%d runs here)", self.config.task, self.executor.runs)

    def _handle(self, request: Request) -> None:
        self._last_request = time.monotonic()
        try:
            out = self.executor.handle(request.op, request.header, request.tensors)
        except ShoalError as e:
            log.warning("%s refused %r from the coordinator: %s", self.config.task, request.op, e)
            raise
        self._rpc.reply(request, out.body.fields(), out.tensors)
        self._last_request = time.monotonic()

    def close(self) -> None:
        """Stop listening. Idempotent."""
        self._rpc.close()


def serve_steps(config: ClusterConfig, registry: StepRegistry, session: Any, *, secret: JobSecret,
                security: Security = Security.AUTO, idle_timeout_s: float | None = 600.0) -> None:
    """Serve the coordinator's step requests against `session` until it says finish. Blocks for
    the whole training; raises CoordinatorError if the coordinator goes silent for
    `idle_timeout_s`. A lost ps that does not come back fails the steps that need it (in-graph
    training does not re-home a ps: `session.fail_lost_ps()`)."""
    if isinstance(session, TrainingSession):  # (steps may also run without one)
        session.fail_lost_ps()
    service = StepService(config, registry, session, secret=secret, security=security)
    try:
        service.serve(idle_timeout_s)
    finally:
        service.close()
