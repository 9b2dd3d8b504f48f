"""`WorkerLink`: the coordinator's connection to one executing worker, with its own thread.

The thread says hello (until the worker answers), creates the per-worker datasets the worker
does not hold yet, then takes closures from the shared queue, one at a time, and runs them on
its worker. A worker that is lost mid-closure (its connection broke, or it stopped answering)
gives the closure back to the queue, to run on another worker, and the link says hello again
until the worker is back (a restarted worker gets its datasets created again).
"""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from typing import Callable, Sequence

from shoal.train.closure_queue import Closure, ClosureQueue
from shoal.train.coordinator_errors import CoordinatorError, StepFailedError
from shoal.train.coordinator_protocol import (CoordOp, DatasetRequest, FinishRequest, HelloReply, HelloRequest,
                                              RunOutcome, RunReply, RunRequest)
from shoal.train.coordinator_values import decode_values
from shoal.wire import JobSecret, PeerLostError, PeerTimeoutError, RemoteError, RpcClient, Security, WireError

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0
FINISH_TIMEOUT_S = 5.0


MAX_ATTEMPTS = 3
"""A closure whose worker is lost this many times fails instead of going round again."""

class LinkState(Enum):
    """CONNECTING (saying hello) -> READY (running closures) -> LOST (its worker went away) ->
    CONNECTING ...; any -> CLOSED (the coordinator closed)."""

    CONNECTING = "connecting"
    READY = "ready"
    LOST = "lost"
    CLOSED = "closed"


DatasetSpec = DatasetRequest  # with its tensors, see `Coordinator._datasets`


class WorkerLink:
    """One executing worker seen from the coordinator. `start()` starts the thread; `close()`
    tells the worker training is over (best effort, bounded) and joins the thread; idempotent.
    `state` may be read from any thread."""

    def __init__(self, task: str, address: str, secret: JobSecret, queue: ClosureQueue, *,
                 datasets: Callable[[], Sequence[tuple[DatasetRequest, dict]]], step_names: Sequence[str],
                 request_timeout_s: float, security: Security = Security.AUTO, origin: str = "",
                 pinned_timeout_s: float | None = None):
        self.task = task
        self.address = address
        self.state = LinkState.CONNECTING
        self.lost_since: float | None = time.monotonic()
        self.runs = 0
        self._rpc = RpcClient(address, secret, task, request_timeout_s, security=security)
        self._queue = queue
        self._datasets = datasets
        self._step_names = tuple(step_names)
        self._request_timeout_s = request_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: set[int] = set()
        self._origin = origin  # the coordinator's id: with a closure's, what the ps dedups pushes by
        self._pinned_timeout_s = pinned_timeout_s

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"shoal-link-{self.task}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish (it says finish to the worker first). Does not block."""
        self._stop.set()

    def close(self, timeout_s: float = FINISH_TIMEOUT_S + 5) -> None:
        """Stop taking closures, say finish to the worker, join the thread. Idempotent; blocks
        up to about `timeout_s`."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self.state = LinkState.CLOSED

    # -- the link's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.state is not LinkState.READY:
                    self._hello()
                    self._fail_pinned_if_gone()
                    continue
                closure = self._queue.take(self.task, 0.2)
                if closure is None:
                    continue
                # Datasets after the take: a closure may use one created just before it was scheduled.
                if self._create_datasets(closure):
                    self._execute(closure)
        finally:
            self._finish()

    def _hello(self) -> None:
        try:
            reply = HelloReply.decode(self._rpc.call(CoordOp.HELLO.value, HelloRequest().fields(),
                                                     timeout_s=HELLO_TIMEOUT_S).header)
        except (PeerTimeoutError, PeerLostError) as e:
            log.debug("%s not answering yet: %s", self.task, e)
            self._stop.wait(0.2)
            return
        except (WireError, CoordinatorError) as e:  # refused (wrong secret, another program), or a bad hello reply
            log.warning("coordinator cannot talk to %s: %s", self.task, e)
            self._stop.wait(2.0)
            return
        missing = set(self._step_names) - set(reply.steps)
        if missing:
            log.warning("%s has not registered the steps %s; is it running the same program as the coordinator?",
                        self.task, sorted(missing))
        self._held = set(reply.held)
        if self.state is LinkState.LOST:
            log.info("%s is back; it takes closures again", self.task)
        self.state, self.lost_since = LinkState.READY, None

    def _fail_pinned_if_gone(self) -> None:
        """Fail the closures pinned to this worker once it has not answered for
        `pinned_timeout_s` (no other worker may run them)."""
        lost_since, timeout = self.lost_since, self._pinned_timeout_s
        if lost_since is None or timeout is None or time.monotonic() - lost_since < timeout:
            return
        failed = self._queue.fail_pinned(self.task, lambda c: CoordinatorError(
            f"step {c.fn!r} (closure {c.id}) is pinned to {self.task}, which has not answered for {timeout:.0f}s "
            f"(at {self.address}); restart {self.task} (it takes its closures again when it is back) before "
            "scheduling on every worker, or raise worker_timeout_s"))
        if failed:
            log.error("%s has not answered for %.0fs: failed the %d closures pinned to it", self.task, timeout, failed)

    def _create_datasets(self, closure: Closure) -> bool:
        """Create every dataset this worker does not hold, before it runs `closure`. False if
        it cannot: the worker was lost (the closure goes back to the queue), or a dataset
        function raised there (the closure fails with that error: join and fetch raise it)."""
        for request, tensors in self._datasets():
            if request.dataset_id in self._held:
                continue
            try:
                self._rpc.call(CoordOp.DATASET.value, request.fields(), tensors, timeout_s=self._request_timeout_s)
            except (PeerLostError, PeerTimeoutError) as e:
                self._lost(e, closure)
                return False
            except RemoteError as e:
                self._settle(closure, CoordinatorError(
                    f"{self.task} could not create dataset {request.dataset_id} ({request.fn}) for step "
                    f"{closure.fn!r}: {e}; fix the function given to create_per_worker_dataset"))
                return False
            self._held.add(request.dataset_id)
        return True

    def _execute(self, closure: Closure) -> None:
        closure.attempts.append(self.task)
        request = RunRequest(closure.id, closure.fn, closure.steps, closure.args, self._origin)
        try:
            message = self._rpc.call(CoordOp.RUN.value, request.fields(), closure.tensors,
                                     timeout_s=self._request_timeout_s)
            reply = RunReply.decode(message.header)
        except (PeerLostError, PeerTimeoutError) as e:
            self._lost(e, closure)
            return
        except WireError as e:  # the worker refused the request (unknown step, bad arguments)
            self._settle(closure, CoordinatorError(f"step {closure.fn!r} (closure {closure.id}) could not run on "
                                                   f"{self.task}: {e}"))
            return
        except CoordinatorError as e:  # a malformed reply
            self._settle(closure, CoordinatorError(f"{self.task} answered step {closure.fn!r} badly: {e}"))
            return
        if reply.outcome is RunOutcome.RAISED:
            self._settle(closure, StepFailedError(self.task, closure.fn, reply.error, reply.traceback))
            return
        try:
            value = decode_values(reply.value, message.tensors, where="step result")
        except CoordinatorError as e:
            self._settle(closure, e)
            return
        self.runs += 1
        closure.result._set(value, self.task)
        self._queue.finished(closure, None)

    def _settle(self, closure: Closure, error: Exception) -> None:
        closure.result._fail(error, self.task)
        self._queue.finished(closure, error)

    def _lost(self, error: Exception, closure: Closure | None) -> None:
        self.state, self.lost_since = LinkState.LOST, time.monotonic()
        self._held.clear()
        if closure is not None and len(closure.attempts) >= MAX_ATTEMPTS:
            self._settle(closure, CoordinatorError(
                f"step {closure.fn!r} (closure {closure.id}) was lost {len(closure.attempts)} times, on "
                f"{', '.join(closure.attempts)} (last: {error}): each worker died or did not answer within "
                f"{self._request_timeout_s:g}s; make the step shorter or raise request_timeout_s"))
            return
        if closure is not None:
            self._queue.put_back(closure)
            log.warning("lost %s while it ran step %r (closure %d): %s; %s", self.task, closure.fn, closure.id, error,
                        "the closure goes to another worker" if closure.worker is None
                        else "the closure, pinned to it, waits for it to come back")
        else:
            log.warning("lost %s: %s", self.task, error)

    def _finish(self) -> None:
        """Tell the worker training is over (it closes its session and exits). Best effort."""
        try:
            self._rpc.call(CoordOp.FINISH.value, FinishRequest().fields(), timeout_s=FINISH_TIMEOUT_S)
        except WireError as e:
            log.debug("%s did not confirm finish: %s", self.task, e)
        finally:
            self._rpc.close()
