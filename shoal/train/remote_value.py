"""`RemoteValue`: the future result of one scheduled step, filled in by the coordinator."""

from __future__ import annotations

import threading
import time
from enum import Enum
from typing import Any, Callable

from shoal.train.coordinator_errors import CoordinatorError


_STOP_CHECK_S = 0.2
"""How often a wait for a result runs the coordinator's stop check."""


class ClosureState(Enum):
    """Where a scheduled call is. PENDING (queued, or running, or re-queued after its worker was
    lost) -> DONE (it returned) | FAILED (it raised, or could not run). DONE and FAILED are final."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class RemoteValue:
    """The result of a step scheduled with `Coordinator.schedule`. Thread-safe."""

    def __init__(self, closure_id: int, step: str, stop_check: Callable[[], None] | None = None):
        self.closure_id = closure_id
        self.step = step
        self._stop_check = stop_check  # raises to leave a wait (SIGTERM on the coordinating chief)
        self.worker: str | None = None  # the worker that ran it, once it ran
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._state = ClosureState.PENDING
        self._value: Any = None
        self._error: Exception | None = None

    @property
    def state(self) -> ClosureState:
        return self._state

    def done(self) -> bool:
        """Whether the step finished (returned or failed). Does not block."""
        return self._done.is_set()

    def fetch(self, timeout: float | None = None) -> Any:
        """The step's result (of its last run, if it ran several times). Blocks until it is
        known, at most `timeout` seconds (CoordinatorError then). Raises the step's error:
        StepFailedError (naming the worker and the remote traceback's last line) if it raised.
        While it waits, the coordinator's stop check may raise instead (TrainingTerminated:
        the chief got SIGTERM and saved its final checkpoint)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(_STOP_CHECK_S if deadline is None else
                                  max(0.0, min(_STOP_CHECK_S, deadline - time.monotonic()))):
            if self._stop_check is not None:
                self._stop_check()
            if deadline is not None and time.monotonic() >= deadline:
                break
        if not self._done.is_set():
            raise CoordinatorError(f"step {self.step!r} (closure {self.closure_id}) has no result after "
                                   f"{timeout:.1f}s; wait longer, or check the workers' logs")
        if self._error is not None:
            raise self._error
        return self._value

    def _set(self, value: Any, worker: str) -> bool:
        return self._finish(ClosureState.DONE, value, None, worker)

    def _fail(self, error: Exception, worker: str | None = None) -> bool:
        return self._finish(ClosureState.FAILED, None, error, worker)

    def _finish(self, state: ClosureState, value: Any, error: Exception | None, worker: str | None) -> bool:
        with self._lock:
            if self._state is not ClosureState.PENDING:
                return False
            self._state, self._value, self._error, self.worker = state, value, error, worker
        self._done.set()
        return True

    def __repr__(self) -> str:
        return f"RemoteValue(closure={self.closure_id}, step={self.step!r}, state={self._state.value})"
