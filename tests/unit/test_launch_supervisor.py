"""The supervisor's policies with a fake executor and an injected clock: no processes,
no sockets. Each fake task follows a script per attempt: exit at once with a code, or run
until a signal stops it (SIGTERM, unless it ignores it; SIGKILL always)."""

import io
import signal
import threading
from pathlib import Path
from typing import Optional

import pytest

from shoal.cli.exit_codes import job_exit_code
from shoal.launch.allocation import Allocation, TaskAllocation, task_ids
from shoal.launch.errors import StartError
from shoal.launch.executor import TaskRef
from shoal.launch.logmux import LogMux
from shoal.launch.plan import make_plan
from shoal.launch.spec import spec_from_dict
from shoal.launch.states import JobState, TaskState
from shoal.launch.supervisor import TRAINING_OVER, EndReason, Supervisor

pytestmark = pytest.mark.timeout(30)
RUN = None  # a script step: run until signalled


class FakeClock:
    """Fake seconds; every reading advances them by `tick` (0: time stands still)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 0.0
        self._tick = tick
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self._tick
            return self.now


class FakeHandle:
    def __init__(self, name: str, pid: int, code: Optional[int], ignore_term: bool) -> None:
        self.name = name
        self.signals: list[int] = []
        self.closed = False
        self._ref = TaskRef("fake", pid=pid)
        self._ignore_term = ignore_term
        self._done = threading.Event()
        self._code: Optional[int] = None
        if code is not None:
            self.exit(code)

    @property
    def ref(self) -> TaskRef:
        return self._ref

    def exit(self, code: int) -> None:
        if not self._done.is_set():
            self._code = code
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return self._code if self._done.wait(timeout) else None

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and not self._ignore_term):
            self.exit(-sig)

    def output(self):
        yield f"{self.name} says".encode()
        yield b" hello"  # the mux completes the last line

    def close(self) -> None:
        self.closed = True


class FakeExecutor:
    kind = "fake"

    def __init__(self, clock: FakeClock, scripts: dict, *, ignore_term: bool = False,
                 fail_start: frozenset = frozenset()) -> None:
        self._clock = clock
        self._scripts = scripts
        self._ignore_term = ignore_term
        self._fail_start = fail_start
        self.handles: list[FakeHandle] = []
        self.starts: list[tuple[str, float]] = []

    def start(self, job, task) -> FakeHandle:
        self.starts.append((task.name, self._clock.now))
        if task.name in self._fail_start:
            raise StartError(f"{task.label}: cannot run 'nope': No such file or directory")
        attempt = sum(name == task.name for name, _ in self.starts) - 1
        script = self._scripts.get(task.name, [RUN])
        handle = FakeHandle(task.name, 1000 + len(self.handles),
                            script[min(attempt, len(script) - 1)], self._ignore_term)
        self.handles.append(handle)
        return handle

    def handle(self, name: str) -> FakeHandle:
        return [h for h in self.handles if h.name == name][-1]

    def close(self) -> None:
        pass


class Recorder:
    """The observer: every change, with the fake time it happened at."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.tasks: list[tuple[float, str, TaskState, TaskState, str]] = []
        self.jobs: list[tuple[JobState, str]] = []
        self.hooks: dict = {}

    def job_changed(self, state, reason) -> None:
        self.jobs.append((state, reason))

    def task_changed(self, task, old, new, detail, ref, restarts) -> None:
        self.tasks.append((self._clock.now, task.name, old, new, detail))
        hook = self.hooks.get((task.name, new))
        if hook:
            hook()

    def final(self) -> dict[str, TaskState]:
        return {name: new for _, name, _, new, _ in self.tasks}

    def times(self, name: str, state: TaskState) -> list[float]:
        return [t for t, n, _, new, _ in self.tasks if n == name and new is state]

    def details(self, name: str, state: TaskState) -> list[str]:
        """The details of `name`'s moves to `state`, in order."""
        return [d for _, n, _, new, d in self.tasks if n == name and new is state]


def plan_of(tmp_path: Path, roles: dict, **extra):
    spec = spec_from_dict({"name": "t", "run": "prog", "roles": roles, **extra})
    allocation = Allocation(
        tasks=tuple(TaskAllocation(t, "127.0.0.1", 1000 + i) for i, t in enumerate(task_ids(spec))),
        master_host="127.0.0.1", master_port=999, python="/py")
    return make_plan(spec, allocation, job_id="t-1", shoal_home=tmp_path, workdir=tmp_path,
                     secret="s")


def supervise(tmp_path, roles, scripts, *, tick=0.0, **options):
    executor_options = {k: options.pop(k) for k in ("ignore_term", "fail_start") if k in options}
    clock = FakeClock(tick)
    plan = plan_of(tmp_path, roles, **options)
    executor = FakeExecutor(clock, scripts, **executor_options)
    recorder = Recorder(clock)
    out = io.BytesIO()
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(out), observer=recorder,
                            clock=clock)
    return supervisor, executor, recorder, out


def test_chief_failure_stops_every_task_with_the_chiefs_code(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"chief": {}, "worker": {"count": 2}, "ps": {}}, {"chief.0": [3]})
    result = supervisor.run()
    assert (result.state, result.reason, result.chief_exit) == (
        JobState.FAILED, EndReason.CHIEF_FAILED, 3)
    assert job_exit_code(result) == 3 and "t.chief.0 failed (exit 3)" in result.detail
    assert recorder.final() == {"ps.0": TaskState.KILLED, "chief.0": TaskState.FAILED,
                                "worker.0": TaskState.KILLED, "worker.1": TaskState.KILLED}
    for name in ("ps.0", "worker.0", "worker.1"):
        assert executor.handle(name).signals == [signal.SIGTERM], name
    assert all(h.closed for h in executor.handles)


def test_chief_killed_by_a_signal_exits_128_plus_the_signal(tmp_path):
    supervisor, _, _, _ = supervise(tmp_path, {"worker": {}}, {"worker.0": [-9]})
    assert job_exit_code(supervisor.run()) == 137


def test_a_failing_worker_that_is_not_the_chief_exits_1(tmp_path):
    supervisor, _, _, _ = supervise(tmp_path, {"chief": {}, "worker": {}}, {"worker.0": [5]})
    result = supervisor.run()
    assert (result.reason, job_exit_code(result)) == (EndReason.TASK_FAILED, 1)


def test_workers_succeeding_stop_the_ps_and_the_job_succeeds(tmp_path):
    supervisor, executor, recorder, out = supervise(
        tmp_path, {"worker": {"count": 2}, "ps": {}}, {"worker.0": [0], "worker.1": [0]})
    result = supervisor.run()
    assert (result.state, result.reason, job_exit_code(result)) == (
        JobState.SUCCEEDED, EndReason.SUCCEEDED, 0)
    assert recorder.final() == {"ps.0": TaskState.KILLED, "worker.0": TaskState.SUCCEEDED,
                                "worker.1": TaskState.SUCCEEDED}
    assert executor.handle("ps.0").signals == [signal.SIGTERM]
    assert b"t.worker.1 | worker.1 says hello\n" in out.getvalue()
    assert (tmp_path / "jobs" / "t-1" / "logs" / "ps.0.log").read_bytes() == b"ps.0 says hello\n"


def test_restart_on_failure_waits_a_doubling_backoff_on_the_injected_clock(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {}}, {"worker.0": [1, 1, 0]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "2s"})
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    failed = recorder.times("worker.0", TaskState.RESTARTING)
    started = recorder.times("worker.0", TaskState.STARTING)
    assert len(failed) == 2 and len(started) == 3
    for backoff, fail, restart in zip((2, 4), failed, started[1:], strict=True):
        assert backoff <= restart - fail < backoff + 1  # not before the backoff, nor long after
    details = [d for _, _, _, new, d in recorder.tasks if new is TaskState.RESTARTING]
    assert details == ["exit 1; restart 1/3 in 2s", "exit 1; restart 2/3 in 4s"]
    assert [name for name, _ in executor.starts] == ["worker.0"] * 3


def test_restarts_used_up_fail_the_job(tmp_path):
    supervisor, executor, _, _ = supervise(
        tmp_path, {"worker": {}}, {"worker.0": [1]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 1, "backoff": "1s"})
    result = supervisor.run()
    assert (result.state, job_exit_code(result)) == (JobState.FAILED, 1)
    assert len(executor.starts) == 2


def test_deadline_stops_every_task_and_fails_the_job(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {}, "ps": {}}, {}, tick=1.0, deadline="10s")
    result = supervisor.run()
    assert (result.state, result.reason, job_exit_code(result)) == (
        JobState.FAILED, EndReason.DEADLINE, 124)
    assert result.detail == "deadline of 10s exceeded"
    assert recorder.jobs[-1] == (JobState.FAILED, "deadline of 10s exceeded")
    assert set(recorder.final().values()) == {TaskState.KILLED}
    assert recorder.times("worker.0", TaskState.KILLED)[0] >= 10


def test_evaluator_failure_is_reported_and_ignored(tmp_path):
    supervisor, executor, recorder, out = supervise(
        tmp_path, {"worker": {}, "evaluator": {}}, {"evaluator.0": [2]})
    recorder.hooks[("evaluator.0", TaskState.FAILED)] = lambda: executor.handle("worker.0").exit(0)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert recorder.final() == {"worker.0": TaskState.SUCCEEDED,
                                "evaluator.0": TaskState.FAILED}
    assert b"t.evaluator.0 failed; an evaluator does not stop the job" in out.getvalue()


def test_start_failure_fails_the_job_and_stops_what_started(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {"count": 2}, "ps": {}}, {}, fail_start=frozenset({"worker.0"}))
    result = supervisor.run()
    assert (result.state, result.reason, job_exit_code(result)) == (
        JobState.FAILED, EndReason.START_FAILED, 127)
    assert "cannot run 'nope'" in result.detail
    assert [name for name, _ in executor.starts] == ["ps.0", "worker.0"]
    assert recorder.final() == {"ps.0": TaskState.KILLED, "worker.0": TaskState.FAILED,
                                "worker.1": TaskState.KILLED}


def test_request_stop_then_force_skips_the_grace_period(tmp_path):
    supervisor, executor, recorder, out = supervise(
        tmp_path, {"worker": {}, "ps": {}}, {}, ignore_term=True, grace_period="1000s")
    running = threading.Event()
    recorder.hooks[("worker.0", TaskState.RUNNING)] = running.set
    results: list = []
    thread = threading.Thread(target=lambda: results.append(supervisor.run()), daemon=True)
    thread.start()
    assert running.wait(10)
    supervisor.request_stop("first")
    termed = threading.Event()
    for _ in range(200):  # bounded: until both got SIGTERM (the clock stands still)
        if all(h.signals == [signal.SIGTERM] for h in executor.handles):
            termed.set()
            break
        threading.Event().wait(0.05)
    assert termed.is_set() and thread.is_alive()  # waiting out the 1000 s grace
    supervisor.request_stop("second")
    thread.join(10)
    assert not thread.is_alive()
    [result] = results
    assert (result.state, result.reason, job_exit_code(result)) == (
        JobState.KILLED, EndReason.STOPPED, 130)
    for handle in executor.handles:
        assert handle.signals == [signal.SIGTERM, signal.SIGKILL]
    assert set(recorder.final().values()) == {TaskState.KILLED}
    said = out.getvalue().decode()  # by the supervisor's thread, not by a signal handler
    assert said.count("shoal | asked to stop again: SIGKILL to every task now") == 1, said


def test_work_handed_over_by_call_soon_runs_on_the_supervisors_thread(tmp_path):
    supervisor, _, recorder, _ = supervise(tmp_path, {"worker": {}}, {}, ignore_term=False)
    ran_on: list = []
    running = threading.Event()
    recorder.hooks[("worker.0", TaskState.RUNNING)] = running.set
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    assert running.wait(10)
    supervisor.call_soon(lambda: ran_on.append(threading.current_thread()))
    for _ in range(100):  # bounded: within _POLL
        if ran_on:
            break
        threading.Event().wait(0.05)
    assert ran_on == [thread]
    supervisor.request_stop("test over", force=True)
    thread.join(10)
    assert not thread.is_alive()


def test_a_worker_that_fails_after_every_ps_finished_is_not_restarted_and_the_job_fails_at_once(tmp_path):
    """A restarted worker would wait for ps that never come back: the job used to end FAILED only
    when the watchdog, the deadline or the worker's own timeout gave up, minutes later."""
    supervisor, executor, recorder, out = supervise(
        tmp_path, {"worker": {"count": 2}, "ps": {}}, {"worker.0": [0]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "1s"})
    recorder.hooks[("worker.0", TaskState.SUCCEEDED)] = lambda: executor.handle("ps.0").exit(0)
    recorder.hooks[("ps.0", TaskState.SUCCEEDED)] = lambda: executor.handle("worker.1").exit(-9)
    result = supervisor.run()
    assert (result.state, job_exit_code(result)) == (JobState.FAILED, 1)
    assert [name for name, _ in executor.starts].count("worker.1") == 1
    assert recorder.details("worker.1", TaskState.FAILED) == [
        f"killed by SIGKILL; not restarted: {TRAINING_OVER}"], recorder.tasks


def test_a_worker_that_fails_while_a_ps_still_serves_is_restarted(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {"count": 2}, "ps": {"count": 2}}, {"worker.1": [1, 0], "worker.0": [RUN]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "1s"})
    recorder.hooks[("worker.1", TaskState.SUCCEEDED)] = lambda: executor.handle("worker.0").exit(0)
    executor_start = executor.start

    def start(job, task):  # ps.0 finished, ps.1 still serves
        handle = executor_start(job, task)
        if task.name == "ps.0":
            handle.exit(0)
        return handle

    executor.start = start
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert [name for name, _ in executor.starts].count("worker.1") == 2


def test_a_task_waiting_for_its_restart_when_the_job_stops_is_killed_before_its_restart(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {"count": 2}}, {"worker.1": [1]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "30s"})
    recorder.hooks[("worker.1", TaskState.RESTARTING)] = lambda: supervisor.request_stop("test over")
    supervisor.run()
    assert recorder.details("worker.1", TaskState.KILLED) == ["job stopped before its restart"], recorder.tasks


def test_a_worker_waiting_for_its_restart_when_the_last_ps_finishes_is_not_started_again(tmp_path):
    supervisor, executor, recorder, _ = supervise(
        tmp_path, {"worker": {"count": 2}, "ps": {}}, {"worker.1": [1, 0]}, tick=0.5,
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "5s"})
    recorder.hooks[("worker.1", TaskState.RESTARTING)] = lambda: executor.handle("ps.0").exit(0)
    result = supervisor.run()
    assert (result.state, job_exit_code(result)) == (JobState.FAILED, 1)
    assert [name for name, _ in executor.starts].count("worker.1") == 1
    assert recorder.details("worker.1", TaskState.FAILED) == [f"exit 1; not restarted: {TRAINING_OVER}"], recorder.tasks
