"""`Coordinator`: in-graph replication. One client (the chief) schedules training steps on the
workers, which run them against their own TrainingSessions, pulling from and pushing to the ps.

    with shoal.Coordinator(config, steps, secret=secret) as coordinator:
        it = coordinator.create_per_worker_dataset("batches", 100)
        losses = [coordinator.schedule("train", it, steps=10) for _ in range(100)]
        coordinator.join(timeout=600)
        print(losses[-1].fetch())

Steps and datasets are functions registered by name in a `StepRegistry` (the same program runs
on every task); arguments and results are tensors and plain values (coordinator_values.py).
A closure runs on whichever worker is free; if its worker is lost, it runs again on another.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable

from shoal.cluster import ClusterConfig
from shoal.logs_default import show_shoal_logs
from shoal.train.closure_queue import Closure, ClosureQueue
from shoal.train.coordinator_errors import CoordinatorError
from shoal.train.coordinator_executor import executor_tasks
from shoal.train.coordinator_protocol import MAX_STEPS_PER_RUN, DatasetRequest
from shoal.train.coordinator_registry import StepRegistry
from shoal.train.coordinator_values import DatasetRef, encode_values
from shoal.train.remote_value import RemoteValue
from shoal.train.shutdown import TrainingTerminated
from shoal.train.worker_link import FINISH_TIMEOUT_S, WorkerLink
from shoal.wire import JobSecret, Security

if TYPE_CHECKING:
    from shoal.train.ps_watch import PsWatch
    from shoal.train.session import TrainingSession

log = logging.getLogger(__name__)

TERMINATED_CLOSE_S = 1.0
"""How long `close` waits for the links when the chief leaves on SIGTERM."""


class CoordinatorState(Enum):
    """NEW -> STARTED (`start`, or entering `with`) -> CLOSED (`close`); NEW -> CLOSED. Only a
    STARTED coordinator schedules; CLOSED is final."""

    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class PerWorkerDataset:
    """A dataset every worker builds for itself from a registered function; pass it (or
    `iter()` of it) to `schedule` and each worker's step receives its own iterator."""

    def __init__(self, dataset_id: int, fn: str):
        self.dataset_ref = DatasetRef(dataset_id)
        self.fn = fn

    def __iter__(self) -> "PerWorkerDataset":
        return self  # as TF's: iter() of it is what steps take

    def __repr__(self) -> str:
        return f"PerWorkerDataset({self.dataset_ref.id}, {self.fn!r})"


class Coordinator:
    """Schedules registered steps on the job's executing workers (every chief or worker task
    but the chief, which runs this). Constructing does no I/O; `start()` starts one dispatcher
    thread per worker and returns at once (workers are connected to as they come up).

    `schedule` and `create_per_worker_dataset` return at once; `join` and `RemoteValue.fetch`
    block, bounded by their timeouts. `request_timeout_s` bounds one closure on one worker
    (longer, and the worker counts as lost); if no worker answers for `worker_timeout_s`, the
    queued closures fail, and so do the closures pinned to one worker that does not answer for
    that long. Thread-safe: schedule from any thread. `close` is idempotent: it
    fails closures that never ran and tells every worker that training is over.

    `session`, the chief's own started TrainingSession, if given, watches the ps tasks while
    the coordinator runs (`session.watch_ps()`, from `start` to `close`): the chief never
    pushes, so this is how a ps that dies is noticed and rebuilt (from its successor's replica,
    else the newest checkpoint) while the workers wait for it, without restarting anything.
    """

    def __init__(self, config: ClusterConfig, registry: StepRegistry, *, secret: JobSecret,
                 security: Security = Security.AUTO, request_timeout_s: float = 600.0,
                 worker_timeout_s: float = 300.0, session: "TrainingSession | None" = None):
        if not config.is_chief:
            raise CoordinatorError(f"{config.task} is not the chief ({config.chief_task}); only the chief runs the "
                                   "Coordinator, the other tasks serve steps (shoal.serve_steps)")
        workers = executor_tasks(config)
        if not workers:
            raise CoordinatorError("the cluster has no worker to run steps on: add worker tasks besides the "
                                   f"chief ({config.chief_task})")
        self.config = config
        self.registry = registry
        self.worker_timeout_s = worker_timeout_s
        self._queue = ClosureQueue()
        self._ids = itertools.count()
        self._dataset_ids = itertools.count()
        self._lock = threading.Lock()
        self._datasets: list[tuple[DatasetRequest, dict]] = []
        self._state = CoordinatorState.NEW
        self._session = session
        self._ps_watch: PsWatch | None = None
        self.origin = secrets.token_hex(6)  # closure ids are "<origin>.<n>" on the ps: unique per coordinator
        self.links = [WorkerLink(str(task), config.cluster.task_address(task.job, task.index), secret, self._queue,
                                 datasets=self._dataset_list, step_names=registry.step_names(),
                                 request_timeout_s=request_timeout_s, security=security, origin=self.origin,
                                 pinned_timeout_s=worker_timeout_s)
                      for task in workers]

    @property
    def state(self) -> CoordinatorState:
        return self._state

    def __enter__(self) -> "Coordinator":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        # On SIGTERM every task of the job got one: the workers leave by themselves, and the
        # chief has its grace period to exit in, not the time to say finish to each of them.
        terminated = exc_type is not None and issubclass(exc_type, TrainingTerminated)
        self.close(TERMINATED_CLOSE_S if terminated else FINISH_TIMEOUT_S + 5)

    def start(self) -> "Coordinator":
        """Start dispatching to the workers. Does not block. Returns self."""
        self._require("start", CoordinatorState.NEW)
        show_shoal_logs()
        if self._session is not None:
            self._ps_watch = self._session.watch_ps()
        for link in self.links:
            link.start()
        self._state = CoordinatorState.STARTED
        log.info("%s coordinates %d workers: %s", self.config.task, len(self.links),
                 ", ".join(link.task for link in self.links))
        return self

    def create_per_worker_dataset(self, fn: Callable | str, *args: Any) -> PerWorkerDataset:
        """Have every worker build its own dataset with the registered dataset function `fn`
        (called there as `fn(ctx, *args)`; it returns an iterable). Returns at once; a worker
        builds it before the first step it runs that uses it (and again if it restarts)."""
        self._require("create_per_worker_dataset", CoordinatorState.STARTED)
        name = StepRegistry.name_of(fn)
        self.registry.get_dataset(name)
        tree, tensors = encode_values(list(args))
        with self._lock:
            dataset_id = next(self._dataset_ids)
            self._datasets.append((DatasetRequest(dataset_id, name, tree), tensors))
        return PerWorkerDataset(dataset_id, name)

    def schedule(self, fn: Callable | str, *args: Any, steps: int = 1) -> RemoteValue:
        """Run the registered step `fn` `steps` times in a row (`fn(ctx, *args)` each time) on
        whichever worker is free. Returns at once; the RemoteValue holds the last run's result.
        Raises UnknownStepError or BadValueError at once for a step that is not registered or
        arguments that cannot travel."""
        return self._schedule(fn, args, steps, None)

    def _schedule(self, fn: Callable | str, args: tuple, steps: int, worker: str | None) -> RemoteValue:
        self._require("schedule", CoordinatorState.STARTED)
        name = StepRegistry.name_of(fn)
        self.registry.get_step(name)
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS_PER_RUN:
            raise CoordinatorError(f"steps={steps!r} must be an int from 1 to {MAX_STEPS_PER_RUN}")
        tree, tensors = encode_values(list(args))
        closure_id = next(self._ids)
        result = RemoteValue(closure_id, name, self._stop_if_terminated)
        self._queue.put(Closure(closure_id, name, steps, tree, tensors, result, worker))
        return result

    def schedule_on_every_worker(self, fn: Callable | str, *args: Any, steps: int = 1) -> list[RemoteValue]:
        """Run the registered step `fn` `steps` times on every worker, one closure pinned to
        each (in `links` order). Returns at once. With sessions in sync mode and
        `replicas_to_aggregate` = the number of workers, each global step then averages one
        gradient from every worker, applied once by the ps (synchronous in-graph training).
        A pinned closure whose worker is lost waits for it to come back, up to
        `worker_timeout_s` from when it was lost; then it fails with a CoordinatorError naming
        the worker (join and fetch raise it)."""
        return [self._schedule(fn, args, steps, link.task) for link in self.links]

    @property
    def num_workers(self) -> int:
        """The workers that execute steps (every replica but the chief)."""
        return len(self.links)

    def done(self) -> bool:
        """Whether every scheduled closure finished (returned or failed). Does not block."""
        return self._queue.pending == 0

    def join(self, timeout: float | None = None) -> None:
        """Block until every scheduled closure finished, at most `timeout` seconds
        (CoordinatorError then, naming how many are left). Then raise the first error of a
        closure since the last join (StepFailedError names the worker and the remote error);
        the other closures still ran. If no worker answers for `worker_timeout_s`, the queued
        closures fail and join raises."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._queue.wait_idle(0.2):
            self._stop_if_terminated()
            self._fail_if_no_worker()
            if deadline is not None and time.monotonic() >= deadline:
                raise CoordinatorError(f"{self._queue.pending} scheduled closures still unfinished after "
                                       f"{timeout:.0f}s; workers: {self._describe_links()}")
        errors = self._queue.take_errors()
        if errors:
            if len(errors) > 1:
                log.error("%d closures failed since the last join; the first is raised", len(errors))
            raise errors[0]

    def close(self, timeout_s: float = FINISH_TIMEOUT_S + 5) -> None:
        """Fail closures that never ran and those still running (their RemoteValues and `join`
        return at once, with a CoordinatorError), tell every worker training is over and stop
        the dispatcher threads. Idempotent; blocks about `timeout_s` at most in all (a worker
        still running a long step is not waited for)."""
        if self._state is CoordinatorState.CLOSED:
            return
        self._state = CoordinatorState.CLOSED
        self._queue.close()
        self._queue.fail_queued(lambda c: CoordinatorError(
            f"step {c.fn!r} (closure {c.id}) never ran: the coordinator was closed first; join() before closing"))
        running = self._queue.fail_in_flight(lambda c: CoordinatorError(
            f"step {c.fn!r} (closure {c.id}) was still running on {c.attempts[-1] if c.attempts else 'a worker'} "
            "when the coordinator was closed; its result is lost (join() before closing)"))
        if running:
            log.warning("closed the coordinator while %d closures ran; they fail, the workers finish them alone",
                        running)
        for link in self.links:
            link.stop()
        deadline = time.monotonic() + timeout_s
        for link in self.links:  # a link still waiting for a long run is left behind (a daemon thread)
            link.close(max(0.0, deadline - time.monotonic()))
        if self._ps_watch is not None:  # after the workers' last steps, which a lost ps would hold up
            self._ps_watch.close(max(0.5, deadline - time.monotonic()))

    # -- internals ---------------------------------------------------------------------------

    def _stop_if_terminated(self) -> None:
        """With the chief's session: if the chief got SIGTERM (shoal kill, a deadline), save its
        final checkpoint and raise TrainingTerminated, from a wait for results. The chief never
        pushes, so without this its SIGTERM would wait for a step boundary that never comes
        (and the launcher's SIGKILL would lose every step since the last checkpoint)."""
        if self._session is not None:
            self._session.stop_if_terminated()

    def _dataset_list(self) -> list[tuple[DatasetRequest, dict]]:
        with self._lock:
            return list(self._datasets)

    def _fail_if_no_worker(self) -> None:
        now = time.monotonic()
        if any(link.lost_since is None or now - link.lost_since < self.worker_timeout_s for link in self.links):
            return
        failed = self._queue.fail_queued(lambda c: CoordinatorError(
            f"step {c.fn!r} (closure {c.id}) found no worker: none answered for {self.worker_timeout_s:.0f}s "
            f"({self._describe_links()})"))
        if failed:
            log.error("no worker answered for %.0fs; failed %d queued closures", self.worker_timeout_s, failed)

    def _describe_links(self) -> str:
        return ", ".join(f"{link.task} {link.state.value}" for link in self.links)

    def _require(self, call: str, state: CoordinatorState) -> None:
        if self._state is not state:
            raise CoordinatorError(f"{call}() needs a {state.value} coordinator, this one is {self._state.value}"
                                   + ("; call start() first (or use `with Coordinator(...)`)"
                                      if self._state is CoordinatorState.NEW else ""))
