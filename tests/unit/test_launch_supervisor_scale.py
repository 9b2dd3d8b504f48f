"""The supervisor's scaling policy with the fake executor of test_launch_supervisor.py: no
processes. Requests are made from an observer hook (the supervisor's own thread) or from
another thread, as the launcher's inbox does."""

import io
import signal

import pytest

from shoal.cluster import TaskId, parse_tf_config
from shoal.launch.allocation import TaskAllocation, take_free_gpus
from shoal.launch.logmux import LogMux
from shoal.launch.scaling import ScaleRequest
from shoal.launch.states import TASK_TRANSITIONS, JobState, TaskState
from shoal.launch.supervisor import Supervisor
from shoal.launch.visible_gpus import VisibleGpus
from tests.unit.test_launch_supervisor import RUN, FakeClock, FakeExecutor, Recorder, plan_of

pytestmark = pytest.mark.timeout(30)


class PlacingExecutor(FakeExecutor):
    """The fake executor, able to add tasks (a TaskPlacer)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plans: dict = {}
        self.placed_among: dict = {}  # index of each added task -> the tasks running then

    def place_task(self, job, task: TaskId, running) -> TaskAllocation:
        self.placed_among[task.index] = [t.name for t in running]
        return TaskAllocation(task, "127.0.0.1", 5000 + task.index)

    def start(self, job, task):
        self.plans[task.name] = task
        return super().start(job, task)


class AddRecorder(Recorder):
    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.added: list[str] = []

    def task_added(self, task) -> None:
        self.added.append(task.name)


def scaled(tmp_path, roles, scripts, *, executor_class=PlacingExecutor, tick=0.0,
           ignore_term=False, **options):
    clock = FakeClock(tick)
    plan = plan_of(tmp_path, roles, **options)
    executor = executor_class(clock, scripts, ignore_term=ignore_term)
    recorder = AddRecorder(clock)
    out = io.BytesIO()
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(out), observer=recorder, clock=clock)
    return supervisor, executor, recorder, out


def end_all(executor) -> None:
    """Every task still running exits 0 (without a chief the job succeeds when every worker has)."""
    for handle in executor.handles:
        handle.exit(0)


def ask(supervisor, outcomes, role, count):
    supervisor.request_scale(ScaleRequest(role, count), outcomes.append)


def ask_then_end(supervisor, executor, outcomes, requests, ender="worker.0"):
    """A hook: ask for each (role, count) of `requests`, serve them at once, then end `ender`
    (exit 0)."""
    def hook() -> None:
        for role, count in requests:
            ask(supervisor, outcomes, role, count)
        supervisor._serve_scales()
        executor.handle(ender).exit(0)
    return hook


def test_scale_up_starts_new_workers_with_fresh_indices_and_their_own_tf_config(tmp_path):
    supervisor, executor, recorder, out = scaled(
        tmp_path, {"ps": {}, "worker": {"count": "2..4"}}, {})
    outcomes: list = []
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 4)

    recorder.hooks[("worker.3", TaskState.RUNNING)] = lambda: end_all(executor)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert [o.describe() for o in outcomes] == ["worker=4 (was 2): started worker:2, worker:3"]
    assert recorder.added == ["worker.2", "worker.3"]
    three = parse_tf_config(executor.plans["worker.3"].env_dict["TF_CONFIG"])
    assert three.cluster.task_indices("worker") == (0, 1, 2, 3)
    assert three.cluster.task_address("worker", 3) == "127.0.0.1:5003"
    zero = parse_tf_config(executor.plans["worker.0"].env_dict["TF_CONFIG"])
    assert zero.cluster.task_indices("worker") == (0, 1)  # running tasks keep theirs
    assert b"scaled worker to 4 (was 2): started worker:2, worker:3" in out.getvalue()


def test_scale_down_stops_the_highest_workers_as_scaled_down_not_failed_nor_restarted(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"worker": {"count": "1..3"}}, {},
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "0s"})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 3)
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 1)
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = lambda: executor.handle("worker.0").exit(0)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert outcomes[1].describe() == "worker=1 (was 3): stopping worker:2, worker:1"
    final = recorder.final()
    assert final["worker.1"] is TaskState.SCALED_DOWN and final["worker.2"] is TaskState.SCALED_DOWN
    assert executor.handle("worker.2").signals == [signal.SIGTERM]
    assert [name for name, _ in executor.starts].count("worker.2") == 1  # not restarted


def test_a_scaled_down_worker_that_ignores_term_is_killed_after_the_grace(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {},
                                               grace_period="2s", tick=0.05, ignore_term=True)
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 1)
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = lambda: executor.handle("worker.0").exit(0)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert executor.handle("worker.1").signals == [signal.SIGTERM, signal.SIGKILL]
    assert recorder.final()["worker.1"] is TaskState.SCALED_DOWN


def test_without_a_chief_the_job_succeeds_when_the_workers_that_exist_now_succeed(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "2..3"}}, {})
    outcomes: list = []
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 3)

    def end_originals() -> None:
        executor.handle("worker.0").exit(0)
        executor.handle("worker.1").exit(0)

    recorder.hooks[("worker.2", TaskState.RUNNING)] = end_originals
    ends: list = []  # when worker.1 succeeds the added worker.2 still runs: the job is not over
    recorder.hooks[("worker.1", TaskState.SUCCEEDED)] = lambda: (
        ends.append(supervisor._result), executor.handle("worker.2").exit(0))
    result = supervisor.run()
    assert ends == [None] and result.state is JobState.SUCCEEDED
    assert recorder.final()["worker.2"] is TaskState.SUCCEEDED


def test_an_added_worker_that_fails_is_restarted_with_the_same_identity(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"worker": {"count": "1..2"}}, {"worker.1": [1, RUN]},
        restart={"policy": "on-failure", "max_restarts": 2, "backoff": "0s"})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    starts: list = []

    def second_start() -> None:
        starts.append(1)
        if len(starts) == 2:
            end_all(executor)

    recorder.hooks[("worker.1", TaskState.RUNNING)] = second_start
    assert supervisor.run().state is JobState.SUCCEEDED
    assert [name for name, _ in executor.starts] == ["worker.0", "worker.1", "worker.1"]
    assert recorder.times("worker.1", TaskState.RESTARTING)


def test_indices_of_scaled_down_workers_are_never_reused(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 1)
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: end_all(executor)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert [o.describe() for o in outcomes] == [
        "worker=2 (was 1): started worker:1", "worker=1 (was 2): stopping worker:1",
        "worker=2 (was 1): started worker:2"]


def test_the_executor_places_an_added_task_among_the_tasks_that_still_hold_a_place(tmp_path):
    """The slots of scaled-down tasks are free again: place_task is told who runs now."""
    supervisor, executor, recorder, _ = scaled(tmp_path, {"ps": {}, "worker": {"count": "1..2"}}, {})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 1)
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: end_all(executor)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert executor.placed_among == {1: ["ps.0", "worker.0"], 2: ["ps.0", "worker.0"]}


def test_a_request_outside_the_range_changes_nothing_and_says_the_range(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {})
    outcomes: list = []

    recorder.hooks[("worker.0", TaskState.RUNNING)] = ask_then_end(
        supervisor, executor, outcomes, (("worker", 5), ("worker", 0), ("ps", 2)))
    assert supervisor.run().state is JobState.SUCCEEDED
    assert [o.ok for o in outcomes] == [False, False, False]
    assert "outside this job's range 1..2" in outcomes[0].error
    assert "this job's ps count is fixed at 0" in outcomes[2].error  # ps scale (up) only with a range
    assert [name for name, _ in executor.starts] == ["worker.0"]


def test_a_job_on_an_executor_that_cannot_add_tasks_says_scale_is_not_supported(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {},
                                               executor_class=FakeExecutor)
    outcomes: list = []

    recorder.hooks[("worker.0", TaskState.RUNNING)] = ask_then_end(supervisor, executor, outcomes, [("worker", 2)])
    assert supervisor.run().state is JobState.SUCCEEDED
    assert "shoal scale is not supported for fake jobs yet" in outcomes[0].error


def test_a_request_left_when_the_job_ends_is_answered_with_an_error(tmp_path):
    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {"worker.0": [0]})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.SUCCEEDED)] = lambda: ask(supervisor, outcomes, "worker", 2)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert len(outcomes) == 1 and "the job ended before the request was served" in outcomes[0].error


# --- regressions -------------------------------------------------------------------

def test_scale_up_from_zero_workers_starts_worker_0_with_the_worker_role_settings(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"ps": {}, "chief": {"run": "chief_prog", "env": {"WHO": "chief"}},
                   "worker": {"count": "0..2", "env": {"WHO": "worker"}}}, {})
    outcomes: list = []
    recorder.hooks[("chief.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 1)
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: executor.handle("chief.0").exit(0)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert [o.describe() for o in outcomes] == ["worker=1 (was 0): started worker:0"]
    worker = executor.plans["worker.0"]
    assert worker.argv == ("prog",)  # the worker role's program, not the chief's
    env = worker.env_dict
    assert env["WHO"] == "worker" and (env["SHOAL_TASK"], env["RANK"], env["WORLD_SIZE"]) == (
        "worker:0", "1", "2")
    config = parse_tf_config(env["TF_CONFIG"])
    assert config.task == TaskId("worker", 0) and config.cluster.task_indices("worker") == (0,)
    assert config.cluster.task_indices("chief") == (0,) and config.cluster.task_indices("ps") == (0,)


def test_an_unexpected_error_in_a_scale_request_is_answered_and_the_job_goes_on(tmp_path):
    class BrokenPlacer(PlacingExecutor):
        def place_task(self, job, task, running):
            raise RuntimeError("the placer broke")

    supervisor, executor, recorder, _ = scaled(tmp_path, {"worker": {"count": "1..2"}}, {},
                                               executor_class=BrokenPlacer)
    outcomes: list = []

    recorder.hooks[("worker.0", TaskState.RUNNING)] = ask_then_end(supervisor, executor, outcomes, [("worker", 2)])
    assert supervisor.run().state is JobState.SUCCEEDED
    assert len(outcomes) == 1 and "worker=2" in outcomes[0].error
    assert "RuntimeError: the placer broke" in outcomes[0].error
    assert executor.handle("worker.0").signals == []  # nothing was killed


def test_scale_down_of_a_worker_waiting_for_its_restart_ends_it_without_restarting_it(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"worker": {"count": "1..3"}}, {"worker.2": [1, RUN]}, tick=1.0, deadline="100s",
        restart={"policy": "on-failure", "max_restarts": 3, "backoff": "30s"})
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 3)
    recorder.hooks[("worker.2", TaskState.RESTARTING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.2", TaskState.SCALED_DOWN)] = lambda: end_all(executor)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED, result.detail  # not the deadline: nothing waits on worker.2
    assert outcomes[1].describe() == "worker=2 (was 3): stopping worker:2"
    assert recorder.final()["worker.2"] is TaskState.SCALED_DOWN
    assert [name for name, _ in executor.starts].count("worker.2") == 1  # not restarted


def test_a_task_not_started_yet_may_be_scaled_down():
    """_scale moves a PENDING task straight to SCALED_DOWN; the transition must be legal."""
    assert TaskState.SCALED_DOWN in TASK_TRANSITIONS[TaskState.PENDING]


class GpuPlacingExecutor(PlacingExecutor):
    """Places added tasks with the GPUs of a 2-GPU host that running tasks do not hold, as the
    local and ssh executors do (allocation.take_free_gpus)."""

    def place_task(self, job, task: TaskId, running) -> TaskAllocation:
        template = job.template(task.job)
        gpus = take_free_gpus(template.gpus, VisibleGpus(("0", "1")), [g for t in running for g in t.gpus], task)
        return TaskAllocation(task, "127.0.0.1", 5000 + task.index, gpus, gpu_host=True)


def test_scale_up_of_a_gpu_role_gives_each_added_task_free_gpus_and_refuses_when_none_is_left(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"chief": {}, "worker": {"count": "0..3", "gpus": 1}}, {}, executor_class=GpuPlacingExecutor)
    outcomes: list = []

    recorder.hooks[("chief.0", TaskState.RUNNING)] = ask_then_end(
        supervisor, executor, outcomes, [("worker", 2), ("worker", 3)], ender="chief.0")
    assert supervisor.run().state is JobState.SUCCEEDED
    assert outcomes[0].started == ("worker:0", "worker:1") and not outcomes[0].error
    assert [executor.plans[f"worker.{i}"].env_dict["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["0", "1"]
    assert "worker:2 cannot be placed: worker:2 asks for 1 GPU(s) but this host has 0 free of 2" in outcomes[1].error
    assert [name for name, _ in executor.starts] == ["chief.0", "worker.0", "worker.1"]


def test_a_gpu_a_scaled_down_task_still_holds_while_it_stops_is_not_given_to_an_added_one(tmp_path):
    """worker:1 is scaled down but ignores TERM (a checkpoint being saved): until it exits its
    GPU is not free, so a scale up meanwhile is refused; once it ended, the GPU goes to the new task."""
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"chief": {}, "worker": {"count": "0..3", "gpus": 1}}, {}, executor_class=GpuPlacingExecutor,
        grace_period="2s", tick=0.05, ignore_term=True)
    outcomes: list = []

    def up_down_up() -> None:
        for count in (2, 1, 2):
            ask(supervisor, outcomes, "worker", count)
            supervisor._serve_scales()

    def up_again() -> None:
        ask(supervisor, outcomes, "worker", 2)
        supervisor._serve_scales()
        executor.handle("chief.0").exit(0)
    recorder.hooks[("chief.0", TaskState.RUNNING)] = up_down_up
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = up_again
    assert supervisor.run().state is JobState.SUCCEEDED
    assert outcomes[1].stopping == ("worker:1",)
    assert "worker:2 asks for 1 GPU(s) but this host has 0 free of 2" in outcomes[2].error
    assert "a task being stopped keeps its GPUs until it exits" in outcomes[2].error
    assert outcomes[3].started == ("worker:2",)
    assert executor.plans["worker.2"].env_dict["CUDA_VISIBLE_DEVICES"] == "1"  # worker:1's, once it ended
