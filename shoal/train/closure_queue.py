"""`ClosureQueue`: the coordinator's scheduled calls, waiting for a free worker.

A closure leaves the queue when a worker takes it and is counted as in flight until it is
finished or put back (its worker was lost: it goes first in line, to run elsewhere), or until
the coordinator settles it without its worker (`fail_in_flight` on close): the worker's late
answer is then ignored. `join` waits until nothing is queued or in flight. Thread-safe: the coordinator's caller schedules,
one dispatcher thread per worker takes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from shoal.train.coordinator_errors import CoordinatorError
from shoal.train.remote_value import RemoteValue


@dataclass
class Closure:
    """One scheduled call: step `fn` run `steps` times with encoded `args` (+ `tensors`)."""

    id: int
    fn: str
    steps: int
    args: list
    tensors: Mapping[str, np.ndarray]
    result: RemoteValue
    worker: str | None = None  # pinned to this worker (synchronous steps), or None: any worker
    attempts: list[str] = field(default_factory=list)  # the workers it was sent to, in order


class ClosureQueue:
    """Queued and in-flight closures, and the first errors not yet reported by `join`."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[Closure] = deque()
        self._running: dict[int, Closure] = {}  # in flight, by id
        self._errors: list[Exception] = []
        self._closed = False

    def put(self, closure: Closure) -> None:
        with self._cv:
            self._queue.append(closure)
            self._cv.notify_all()

    def take(self, worker: str, timeout: float) -> Closure | None:
        """The first closure `worker` may run (pinned to it, or to none), now in flight; None
        after `timeout` seconds or once closed. Blocks."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._closed:
                for k, closure in enumerate(self._queue):
                    if closure.worker is None or closure.worker == worker:
                        del self._queue[k]
                        self._running[closure.id] = closure
                        return closure
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cv.wait(remaining)
            return None

    def put_back(self, closure: Closure) -> None:
        """An in-flight closure whose worker was lost: first in line again (failed instead if
        the queue is closed; nothing if it was settled already)."""
        with self._cv:
            if self._running.pop(closure.id, None) is None:
                return
            if self._closed:
                self._fail(closure, CoordinatorError(f"step {closure.fn!r} (closure {closure.id}) lost its worker "
                                                     "after the coordinator was closed; join() before closing"))
            else:
                self._queue.appendleft(closure)
            self._cv.notify_all()

    def finished(self, closure: Closure, error: Exception | None) -> None:
        """An in-flight closure is over (its RemoteValue is already set). Ignored if it was
        settled already (`fail_in_flight`)."""
        with self._cv:
            if self._running.pop(closure.id, None) is None:
                return
            if error is not None:
                self._errors.append(error)
            self._cv.notify_all()

    def fail_in_flight(self, error_for) -> int:
        """Fail every in-flight closure with `error_for(closure)`, without waiting for its
        worker (whose answer is then ignored); returns how many."""
        with self._cv:
            failed = list(self._running.values())
            self._running.clear()
            for closure in failed:
                self._fail(closure, error_for(closure))
            self._cv.notify_all()
            return len(failed)

    def fail_pinned(self, worker: str, error_for) -> int:
        """Fail every queued closure pinned to `worker` with `error_for(closure)`; returns how many."""
        with self._cv:
            failed = [c for c in self._queue if c.worker == worker]
            if failed:
                self._queue = deque(c for c in self._queue if c.worker != worker)
                for closure in failed:
                    self._fail(closure, error_for(closure))
                self._cv.notify_all()
            return len(failed)

    def _fail(self, closure: Closure, error: Exception) -> None:
        if closure.result._fail(error):
            self._errors.append(error)

    def fail_queued(self, error_for) -> int:
        """Fail every queued (not in-flight) closure with `error_for(closure)`; returns how many."""
        with self._cv:
            failed = list(self._queue)
            self._queue.clear()
            for closure in failed:
                self._fail(closure, error_for(closure))
            self._cv.notify_all()
            return len(failed)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        """Closures queued or in flight."""
        with self._cv:
            return len(self._queue) + len(self._running)

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until nothing is queued or in flight (True), or `timeout` passed (False)."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._running, timeout)

    def take_errors(self) -> list[Exception]:
        """The errors since the last call, oldest first; clears them."""
        with self._cv:
            errors, self._errors = self._errors, []
            return errors
