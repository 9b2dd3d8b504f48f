"""In-graph replication on real sockets: a Coordinator schedules registered steps on worker
step services (threads here, processes for MNIST and failures); errors surface on join/fetch."""

from __future__ import annotations

import re
import secrets
import threading

import numpy as np
import pytest

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.train.coordinator import Coordinator
from shoal.train.coordinator_errors import CoordinatorError, StepFailedError, UnknownStepError
from shoal.train.coordinator_registry import StepRegistry
from shoal.train.coordinator_service import StepService
from shoal.train.remote_value import ClosureState
from shoal.wire import JobSecret
from tests.cluster.harness import free_ports

steps = StepRegistry()


@steps.step
def scale(ctx, x, factor):
    return {"y": x * factor, "task": ctx.task}


@steps.step
def boom(ctx, n):
    raise ValueError(f"bad batch {n}")


@steps.dataset
def counter(ctx, start):
    return iter(range(start + 100 * ctx.shard_index, 10**9))


@steps.step
def take(ctx, it):
    return next(it)


class InProcessJob:
    """A chief's Coordinator and worker StepServices on threads, on free loopback ports."""

    def __init__(self, num_workers: int, worker_registry: StepRegistry = steps):
        ports = free_ports(num_workers + 1)
        self.spec = ClusterSpec.from_dict({"chief": [f"127.0.0.1:{ports[0]}"],
                                           "worker": [f"127.0.0.1:{p}" for p in ports[1:]]})
        self.secret = JobSecret(secrets.token_bytes(16), "test")
        self.services = [StepService(ClusterConfig(self.spec, TaskId("worker", i)), worker_registry, None,
                                     secret=self.secret) for i in range(num_workers)]
        self.threads = []
        self.errors: list[BaseException] = []
        for service in self.services:
            service.start()
            thread = threading.Thread(target=self._serve, args=(service,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, service: StepService) -> None:
        try:
            service.serve(idle_timeout_s=60)
        except BaseException as e:  # reported by the test
            self.errors.append(e)
        finally:
            service.close()

    def coordinator(self, registry: StepRegistry = steps) -> Coordinator:
        return Coordinator(ClusterConfig(self.spec, TaskId("chief", 0)), registry, secret=self.secret,
                           worker_timeout_s=30)

    def close(self) -> None:
        for service in self.services:
            service.executor.finished = True
        for thread in self.threads:
            thread.join(10)


@pytest.fixture
def job_of():
    jobs = []

    def make(num_workers, worker_registry=steps):
        jobs.append(InProcessJob(num_workers, worker_registry))
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


def test_schedule_runs_steps_on_the_workers_and_fetch_returns_their_results(job_of):
    job = job_of(2)
    with job.coordinator() as coordinator:
        x = np.arange(4, dtype=np.float32)
        results = [coordinator.schedule(scale, x, float(i)) for i in range(20)]
        coordinator.join(timeout=60)
        assert coordinator.done()
        for i, r in enumerate(results):
            value = r.fetch(0)
            np.testing.assert_array_equal(value["y"], x * i)
            assert value["task"] == r.worker and r.state is ClosureState.DONE
    for thread in job.threads:
        thread.join(10)
    assert not any(t.is_alive() for t in job.threads), "finish did not end the workers' services"
    assert job.errors == []


def test_join_raises_the_step_error_naming_the_worker_and_other_closures_still_run(job_of):
    job = job_of(2)
    with job.coordinator() as coordinator:
        good = [coordinator.schedule(scale, np.ones(2), 2.0) for _ in range(5)]
        bad = coordinator.schedule(boom, 7)
        good += [coordinator.schedule(scale, np.ones(2), 3.0) for _ in range(5)]
        with pytest.raises(StepFailedError) as raised:
            coordinator.join(timeout=60)
        error = raised.value
        assert error.worker in ("worker:0", "worker:1") and error.worker == bad.worker
        assert error.last_line == "ValueError: bad batch 7"
        assert re.search(r"step 'boom' failed on worker:\d: ValueError: bad batch 7", str(error))
        assert all(r.state is ClosureState.DONE for r in good)
        with pytest.raises(StepFailedError, match="bad batch 7"):
            bad.fetch(0)
        coordinator.join(timeout=10)  # the error was reported once


def test_a_step_the_workers_never_registered_fails_clearly_and_the_worker_keeps_serving(job_of):
    worker_steps = StepRegistry()
    worker_steps.step(scale)
    job = job_of(1, worker_steps)
    coordinator_steps = StepRegistry()
    coordinator_steps.step(scale)
    coordinator_steps.step(boom)
    with job.coordinator(coordinator_steps) as coordinator:
        missing = coordinator.schedule("boom", 1)
        with pytest.raises(CoordinatorError, match="could not run on worker:0.*no step named 'boom'"):
            missing.fetch(30)
        assert coordinator.schedule(scale, np.ones(1), 5.0).fetch(30)["y"][0] == 5.0
        with pytest.raises(CoordinatorError):
            coordinator.join(timeout=30)


def test_schedule_refuses_unregistered_steps_and_unsendable_arguments_at_once(job_of):
    job = job_of(1)
    with job.coordinator() as coordinator:
        with pytest.raises(UnknownStepError, match="no step named 'nope'"):
            coordinator.schedule("nope")
        with pytest.raises(CoordinatorError, match="cannot be sent to a worker"):
            coordinator.schedule(scale, object(), 1.0)
        assert coordinator.done()


def test_per_worker_datasets_give_each_worker_its_own_iterator(job_of):
    job = job_of(2)
    with job.coordinator() as coordinator:
        it = coordinator.create_per_worker_dataset(counter, 5)
        results = [coordinator.schedule(take, it) for _ in range(30)]
        coordinator.join(timeout=60)
    by_worker: dict[str, list[int]] = {}
    for r in results:
        by_worker.setdefault(r.worker, []).append(r.fetch(0))
    for worker, values in by_worker.items():
        start = 5 + 100 * int(worker.split(":")[1])
        assert values == list(range(start, start + len(values))), (worker, values)


def test_fetch_with_a_timeout_raises_when_no_worker_takes_the_closure():
    ports = free_ports(2)
    spec = ClusterSpec.from_dict({"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})
    with Coordinator(ClusterConfig(spec, TaskId("chief", 0)), steps,
                     secret=JobSecret(secrets.token_bytes(16), "test")) as coordinator:
        result = coordinator.schedule(take, 1)
        with pytest.raises(CoordinatorError, match="has no result after 0.5s"):
            result.fetch(0.5)
        with pytest.raises(CoordinatorError, match="1 scheduled closures still unfinished"):
            coordinator.join(timeout=1)
    with pytest.raises(CoordinatorError, match="never ran: the coordinator was closed first"):
        result.fetch(0)


def test_schedule_on_every_worker_runs_one_closure_pinned_to_each(job_of):
    job = job_of(3)
    with job.coordinator() as coordinator:
        rounds = [coordinator.schedule_on_every_worker(scale, np.ones(1), float(i), steps=2) for i in range(4)]
        coordinator.join(timeout=60)
    for results in rounds:
        assert [r.fetch(0)["task"] for r in results] == ["worker:0", "worker:1", "worker:2"]


@steps.dataset
def broken_data(ctx):
    raise OSError("no such file: shard-7.npy")


def test_a_dataset_function_that_raises_fails_its_steps_with_the_error_instead_of_hanging(job_of):
    job = job_of(1)
    with job.coordinator() as coordinator:
        it = coordinator.create_per_worker_dataset(broken_data)
        result = coordinator.schedule(take, it)
        with pytest.raises(CoordinatorError, match=r"could not create dataset .*shard-7\.npy"):
            coordinator.join(timeout=60)
        with pytest.raises(CoordinatorError, match="create_per_worker_dataset"):
            result.fetch(0)


def test_a_closure_pinned_to_a_worker_that_never_answers_fails_naming_it_after_worker_timeout(job_of):
    job = job_of(1)
    ports = free_ports(1)  # worker:1 is in the cluster, but nothing ever serves there
    spec = ClusterSpec.from_dict({"chief": job.spec.as_dict()["chief"],
                                  "worker": [*job.spec.as_dict()["worker"], f"127.0.0.1:{ports[0]}"]})
    with Coordinator(ClusterConfig(spec, TaskId("chief", 0)), steps, secret=job.secret,
                     worker_timeout_s=2) as coordinator:
        alive, gone = coordinator.schedule_on_every_worker(scale, np.ones(1), 2.0)
        with pytest.raises(CoordinatorError, match=r"pinned to worker:1, which has not answered for 2s.*restart "
                                                   r"worker:1"):
            gone.fetch(60)
        assert alive.fetch(30)["task"] == "worker:0"
        with pytest.raises(CoordinatorError, match="pinned to worker:1"):
            coordinator.join(timeout=30)
        assert coordinator.schedule(scale, np.ones(1), 3.0).fetch(30)["y"][0] == 3.0  # unpinned: still served


release = threading.Event()
running = threading.Event()


@steps.step
def long_step(ctx):
    running.set()
    release.wait(60)
    return "finished late"


def test_close_while_a_long_step_runs_settles_it_so_fetch_and_join_return(job_of):
    job = job_of(1)
    release.clear()
    running.clear()
    coordinator = job.coordinator().start()
    try:
        result = coordinator.schedule(long_step)
        assert running.wait(30)
        closer = threading.Thread(target=coordinator.close, daemon=True)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close() waited for the running step"
        assert result.state is ClosureState.FAILED and coordinator.done()
        with pytest.raises(CoordinatorError, match=r"'long_step' \(closure 0\) was still running on worker:0 when "
                                                   r"the coordinator was closed"):
            result.fetch(0)
        with pytest.raises(CoordinatorError, match="still running on worker:0"):
            coordinator.join(timeout=5)
    finally:
        release.set()
        coordinator.close()
