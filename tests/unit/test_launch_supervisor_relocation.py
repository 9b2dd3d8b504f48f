"""The supervisor's relocation policy (shoal/launch/relocation.py) with the fake executor: a
worker whose host was lost moves to another host as a new worker; anything else restarts where
it was, as before."""

import io

import pytest

from shoal.cluster import TaskId, parse_tf_config
from shoal.launch.allocation import TaskAllocation
from shoal.launch.errors import AllocationEndedError, HostUnreachableError, PlanError, StartDeferred, StartError
from shoal.launch.executor import HostLossAware
from shoal.launch.logmux import LogMux
from shoal.launch.relocation import movable
from shoal.launch.scaling import ScaleRequest
from shoal.launch.states import JobState, TaskState
from shoal.launch.supervisor import MOVE_TRIES, EndReason, Supervisor
from tests.unit.test_launch_supervisor import FakeClock, FakeHandle, plan_of
from tests.unit.test_launch_supervisor_scale import AddRecorder, PlacingExecutor, end_all

pytestmark = pytest.mark.timeout(30)
LOST = 255
ON_FAILURE = {"restart": {"policy": "on-failure", "max_restarts": 2, "backoff": "1s"}}


class HostHandle(FakeHandle):
    """A fake task handle that can end because its host was lost."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lost_host = None

    def lose_host(self, node: str) -> None:
        self.lost_host = node
        self.exit(LOST)


class HostExecutor(PlacingExecutor):
    """Places added tasks on the first of `hosts` ("host9") not to avoid, or refuses with
    `no_room`; a start on a host of `broken` fails."""

    def __init__(self, *args, no_room: bool = False, hosts=("host9",), broken=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.no_room = no_room
        self.hosts = hosts
        self.broken = broken
        self.avoided: list = []  # the hosts each placement was told to avoid

    def place_task(self, job, task: TaskId, running, avoid=()) -> TaskAllocation:
        self.avoided.append(tuple(avoid))
        free = [h for h in self.hosts if h not in avoid]
        if self.no_room or not free:
            raise PlanError("every connected host of the job (host1) has used its slots")
        self.placed_among[task.index] = [t.name for t in running]
        return TaskAllocation(task, f"10.0.0.{self.hosts.index(free[0]) + 9}", 5000 + task.index, node=free[0])

    def start(self, job, task):
        if task.node in self.broken:
            raise StartError(f"{task.label} could not be started on {task.node}: python3: not found")
        self.plans[task.name] = task
        self.starts.append((task.name, self._clock.now))
        handle = HostHandle(task.name, 1000 + len(self.handles), None, False)
        self.handles.append(handle)
        return handle


def relocating(tmp_path, roles, tick=0.0, **kwargs):
    clock = FakeClock(tick)
    plan = plan_of(tmp_path, roles, **ON_FAILURE)
    executor = HostExecutor(clock, {}, **kwargs)
    recorder = AddRecorder(clock)
    out = io.BytesIO()
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(out), observer=recorder, clock=clock)
    return supervisor, executor, recorder, out


def test_a_worker_whose_host_was_lost_moves_to_another_host_as_a_new_worker(tmp_path):
    supervisor, executor, recorder, out = relocating(tmp_path, {"ps": {}, "worker": {"count": 3}})
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host3")
    recorder.hooks[("worker.3", TaskState.RUNNING)] = lambda: end_all(executor)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED  # workers 0, 2 and the replacement 3 succeeded; 1 is MOVED
    final = recorder.final()
    assert final["worker.1"] is TaskState.MOVED and final["worker.3"] is TaskState.SUCCEEDED
    moved = [d for _, n, _, new, d in recorder.tasks if n == "worker.1" and new is TaskState.MOVED]
    assert moved == ["exit 255; host3 was lost: moved to host9 as worker:3"]
    assert "worker.1" not in executor.placed_among[3]  # its slot on the lost host is not counted
    assert [n for n, _ in executor.starts].count("worker.1") == 1  # never restarted on its dead host
    three = parse_tf_config(executor.plans["worker.3"].env_dict["TF_CONFIG"])
    assert three.task == TaskId("worker", 3) and three.cluster.task_indices("worker") == (0, 2, 3)
    assert b"shoal | host3 was lost: worker:1 moves to host9 as worker:3 (restart 1/2)" in out.getvalue()


def test_a_replacement_inherits_the_restart_count_so_hosts_that_keep_vanishing_fail_the_job(tmp_path):
    supervisor, executor, recorder, _ = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}})
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: executor.handle("worker.2").lose_host("host9")
    recorder.hooks[("worker.3", TaskState.RUNNING)] = lambda: executor.handle("worker.3").lose_host("host9")
    result = supervisor.run()
    assert result.state is JobState.FAILED and result.detail == "t.worker.3 failed (exit 255)"
    final = recorder.final()
    assert (final["worker.1"], final["worker.2"], final["worker.3"]) == (
        TaskState.MOVED, TaskState.MOVED, TaskState.FAILED)


@pytest.mark.parametrize("lost", ["ps.0", "worker.0"])  # a ps's address is in every TF_CONFIG; worker.0 is primary
def test_a_task_that_may_not_move_restarts_where_it_was(tmp_path, lost):
    supervisor, executor, recorder, _ = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}}, tick=0.05)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle(lost).lose_host("host1")
    started = []
    recorder.hooks[(lost, TaskState.STARTING)] = lambda: started.append(lost)

    def finish_after_restart():
        if len(started) == 2:
            end_all(executor)
    recorder.hooks[(lost, TaskState.RUNNING)] = finish_after_restart
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert recorder.added == [] and TaskState.MOVED not in recorder.final().values()
    assert [n for n, _ in executor.starts].count(lost) == 2  # same identity, same place


def test_a_lost_worker_with_no_host_to_go_to_restarts_on_its_own_host(tmp_path):
    supervisor, executor, recorder, out = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}}, tick=0.05,
                                                     no_room=True)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: (
        executor.handle("worker.1").lose_host("host2") if len(executor.handles) < 4 else end_all(executor))
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert [n for n, _ in executor.starts].count("worker.1") == 2 and recorder.added == []
    assert (b"shoal | t.worker.1: host2 was lost and no other host can take it (every connected host of the job"
            b" (host1) has used its slots); it restarts on host2 once that answers again") in out.getvalue()


def test_without_restarts_a_lost_worker_fails_the_job_and_does_not_move(tmp_path):
    clock = FakeClock(0.0)
    plan = plan_of(tmp_path, {"ps": {}, "worker": {"count": 2}})  # restart: never (the default)
    executor = HostExecutor(clock, {})
    recorder = AddRecorder(clock)
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(io.BytesIO()), observer=recorder, clock=clock)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    result = supervisor.run()
    assert result.state is JobState.FAILED and recorder.added == []


def test_a_replacement_that_cannot_start_on_one_host_starts_on_the_next(tmp_path):
    supervisor, executor, recorder, out = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}},
                                                     hosts=("host8", "host9"), broken=("host8",))
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    recorder.hooks[("worker.2", TaskState.RUNNING)] = lambda: end_all(executor)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED, result.detail
    assert executor.avoided == [(), ("host8",)]
    assert executor.plans["worker.2"].node == "host9" and recorder.added == ["worker.2"]
    final = recorder.final()
    assert final["worker.1"] is TaskState.MOVED and final["worker.2"] is TaskState.SUCCEEDED
    text = out.getvalue().decode()
    assert "worker:2 could not be started on host8 (t.worker.2 could not be started on host8: python3: not found)" \
        in text, text
    assert "shoal | host2 was lost: worker:1 moves to host9 as worker:2 (restart 1/2)" in text


def test_a_lost_worker_whose_replacement_starts_on_no_host_ends_the_job_naming_each_host_and_error(tmp_path):
    supervisor, executor, recorder, _ = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}},
                                                   hosts=("host8", "host9"), broken=("host8", "host9"))
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    result = supervisor.run()
    assert result.state is JobState.FAILED and result.reason is EndReason.START_FAILED
    assert executor.avoided == [(), ("host8",), ("host8", "host9")]
    assert ("host2 was lost and its replacement worker:2 could not be started on any other host: "
            "host8 (t.worker.2 could not be started on host8: python3: not found), "
            "host9 (t.worker.2 could not be started on host9: python3: not found)") in result.detail, result.detail
    assert recorder.final()["worker.1"] is TaskState.FAILED and recorder.added == []


def test_a_placer_that_offers_a_host_tried_already_ends_the_job_instead_of_trying_it_forever(tmp_path):
    class StubbornExecutor(HostExecutor):
        def place_task(self, job, task, running, avoid=()):
            return super().place_task(job, task, running)  # ignores `avoid`

    clock = FakeClock(0.0)
    executor = StubbornExecutor(clock, {}, hosts=("host8",), broken=("host8",))
    recorder = AddRecorder(clock)
    supervisor = Supervisor(plan_of(tmp_path, {"ps": {}, "worker": {"count": 2}}, **ON_FAILURE), executor=executor,
                            mux=LogMux(io.BytesIO()), observer=recorder, clock=clock)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    result = supervisor.run()
    assert result.reason is EndReason.START_FAILED and "host8 (t.worker.2 could not be started" in result.detail
    assert executor.avoided == [(), ()]


def test_only_non_primary_workers_move_and_handles_report_a_lost_host():
    assert movable(TaskId("worker", 3), TaskId("worker", 0))
    assert not movable(TaskId("worker", 0), TaskId("worker", 0))
    assert not movable(TaskId("ps", 1), TaskId("chief", 0)) and not movable(TaskId("chief", 0), TaskId("chief", 0))
    assert isinstance(HostHandle("w", 1, None, False), HostLossAware)


def test_a_replacement_is_tried_on_at_most_move_tries_hosts_then_the_job_ends_naming_them(tmp_path):
    hosts = ("host5", "host6", "host7", "host8", "host9")
    supervisor, executor, recorder, _ = relocating(tmp_path, {"ps": {}, "worker": {"count": 2}}, hosts=hosts,
                                                   broken=hosts)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").lose_host("host2")
    result = supervisor.run()
    assert result.state is JobState.FAILED and result.reason is EndReason.START_FAILED
    assert len(executor.avoided) == MOVE_TRIES == 3  # each try waits on an agent: a bounded number of them
    assert "could not be started on the 3 hosts tried (the most a move tries): host5 (" in result.detail, result.detail
    assert "host8" not in result.detail and recorder.added == []


class UnreachableExecutor(HostExecutor):
    """Restarts of the tasks named in `down` fail as the SSH executor's do while a lost host does
    not answer (HostUnreachableError), `outage` times each, then succeed."""

    def __init__(self, *args, down=(), outage=1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.down = down
        self.outage = outage
        self.refused: dict[str, int] = {}

    def start(self, job, task):
        already_ran = any(n == task.name for n, _ in self.starts)
        if already_ran and task.name in self.down and self.refused.get(task.name, 0) < self.outage:
            self.refused[task.name] = self.refused.get(task.name, 0) + 1
            raise HostUnreachableError(f"{task.label} cannot be restarted on host2: host2: unreachable"
                                       " (ssh: connect to host 10.0.0.3 port 22: Connection timed out)")
        return super().start(job, task)


def unreachable(tmp_path, roles, lost, outage, max_restarts=3):
    clock = FakeClock(0.05)
    plan = plan_of(tmp_path, roles, restart={"policy": "on-failure", "max_restarts": max_restarts, "backoff": "1s"})
    executor = UnreachableExecutor(clock, {}, no_room=True, down=(lost,), outage=outage)
    recorder = AddRecorder(clock)
    out = io.BytesIO()
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(out), observer=recorder, clock=clock)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle(lost).lose_host("host2")
    return supervisor, executor, recorder, out


@pytest.mark.parametrize("lost", ["ps.0", "worker.0"])
def test_a_restart_whose_lost_host_still_does_not_answer_is_tried_again_until_the_host_is_back(tmp_path, lost):
    supervisor, executor, recorder, out = unreachable(tmp_path, {"ps": {}, "worker": {"count": 2}}, lost, outage=2)

    def finish_once_back():
        if executor.refused.get(lost) == 2:
            end_all(executor)
    recorder.hooks[(lost, TaskState.RUNNING)] = finish_once_back
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED, result.detail
    assert [n for n, _ in executor.starts].count(lost) == 2  # started, then again once host2 answered
    details = [d for _, n, _, new, d in recorder.tasks if n == lost and new is TaskState.RESTARTING]
    assert details[0] == "exit 255; restart 1/3 in 1s"
    assert details[1:] == [f"t.{lost} cannot be restarted on host2: host2: unreachable (ssh: connect to host 10.0.0.3"
                           f" port 22: Connection timed out); restart {n}/3 in {d}s" for n, d in ((2, 2), (3, 4))]


def test_a_lost_host_that_stays_away_fails_the_job_once_restarts_run_out_with_the_lost_attempts_code(tmp_path):
    supervisor, executor, recorder, _ = unreachable(tmp_path, {"ps": {}, "worker": {"count": 2}}, "worker.0",
                                                    outage=10, max_restarts=2)
    result = supervisor.run()
    assert result.state is JobState.FAILED and result.reason is EndReason.CHIEF_FAILED and result.chief_exit == 255
    assert executor.refused["worker.0"] == 2  # restart 1 (after the loss) and restart 2 found host2 away
    assert "t.worker.0 cannot be restarted on host2: host2: unreachable" in result.detail, result.detail
    assert recorder.final()["worker.0"] is TaskState.FAILED


def test_a_restart_in_an_allocation_that_ended_fails_the_task_for_good_at_once(tmp_path):
    class EndedExecutor(HostExecutor):
        def start(self, job, task):
            if any(n == task.name for n, _ in self.starts):
                raise AllocationEndedError(f"{task.label} cannot be restarted on n1: Slurm job 7 is CANCELLED (...)")
            return super().start(job, task)

    clock = FakeClock(0.05)
    executor = EndedExecutor(clock, {}, no_room=True)
    recorder = AddRecorder(clock)
    supervisor = Supervisor(plan_of(tmp_path, {"ps": {}, "worker": {"count": 2}}, **ON_FAILURE), executor=executor,
                            mux=LogMux(io.BytesIO()), observer=recorder, clock=clock)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("ps.0").lose_host("n1")
    result = supervisor.run()
    assert result.reason is EndReason.TASK_FAILED  # not START_FAILED: no program failed to start
    assert result.detail == "t.ps.0 failed (t.ps.0 cannot be restarted on n1: Slurm job 7 is CANCELLED (...))"
    assert [n for n, _ in executor.starts].count("ps.0") == 1


class DeferringExecutor(HostExecutor):
    """Restarts of `lost` are deferred (StartDeferred, as while the SSH executor reconnects to a
    lost host in the background) `deferrals` times, then start; `during` runs at the first."""

    def __init__(self, *args, lost="", deferrals=3, during=lambda: None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lost, self.deferrals, self.during = lost, deferrals, during
        self.deferred = 0

    def start(self, job, task):
        already_ran = any(n == task.name for n, _ in self.starts)
        if already_ran and task.name == self.lost and self.deferred < self.deferrals:
            self.deferred += 1
            if self.deferred == 1:
                self.during()
            raise StartDeferred(f"{task.label} waits for host2 to be reconnected")
        return super().start(job, task)


def deferring(tmp_path, lost, deferrals, roles=None):
    clock = FakeClock(0.05)
    plan = plan_of(tmp_path, roles or {"ps": {}, "worker": {"count": 2}}, **ON_FAILURE)
    executor = DeferringExecutor(clock, {}, no_room=True, lost=lost, deferrals=deferrals)
    recorder = AddRecorder(clock)
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(io.BytesIO()), observer=recorder, clock=clock)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle(lost).lose_host("host2")
    return supervisor, executor, recorder


def test_a_start_deferred_while_its_host_is_reconnected_counts_no_restart_and_the_job_goes_on(tmp_path):
    supervisor, executor, recorder = deferring(tmp_path, "ps.0", deferrals=5)
    # While ps.0 waits for host2, worker.0 ends: the loop sees it at once (worker.0 SUCCEEDED
    # before ps.0 runs again), where a start that blocked would have held the loop up.
    executor.during = lambda: executor.handle("worker.0").exit(0)
    recorder.hooks[("ps.0", TaskState.RUNNING)] = lambda: end_all(executor) if executor.deferred == 5 else None
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED, result.detail
    ps = [(old, new, d) for _, n, old, new, d in recorder.tasks if n == "ps.0"]
    assert [new for _, new, _ in ps] == [TaskState.STARTING, TaskState.RUNNING, TaskState.RESTARTING,
                                         TaskState.STARTING, TaskState.RUNNING, TaskState.SUCCEEDED], ps
    assert ps[2][2] == "exit 255; restart 1/2 in 1s"  # the loss counts; the 5 deferrals do not
    order = [(n, new) for _, n, _, new, _ in recorder.tasks]
    assert order.index(("worker.0", TaskState.SUCCEEDED)) < order.index(("ps.0", TaskState.RUNNING), 2)


def test_a_job_stopped_while_a_start_is_deferred_ends_that_task_killed_before_its_restart(tmp_path):
    supervisor, executor, recorder = deferring(tmp_path, "worker.0", deferrals=10 ** 9)
    executor.during = lambda: supervisor.request_stop("stopped by SIGINT")
    result = supervisor.run()
    assert result.reason is EndReason.STOPPED, result.detail
    assert recorder.final()["worker.0"] is TaskState.KILLED
    assert [d for _, n, _, new, d in recorder.tasks if n == "worker.0" and new is TaskState.KILLED] == \
        ["job stopped before its restart"]
    assert executor.deferred == 1  # stopped at the next turn of the loop, not after the host answered


def test_a_task_scaled_down_while_its_start_is_deferred_ends_scaled_down(tmp_path):
    clock = FakeClock(0.05)
    plan = plan_of(tmp_path, {"ps": {}, "worker": {"count": "1..2"}}, **ON_FAILURE)
    executor = DeferringExecutor(clock, {}, lost="worker.1", deferrals=10 ** 9)
    recorder = AddRecorder(clock)
    supervisor = Supervisor(plan, executor=executor, mux=LogMux(io.BytesIO()), observer=recorder, clock=clock)
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = \
        lambda: supervisor.request_scale(ScaleRequest("worker", 2), outcomes.append)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.1").exit(1)  # restarted there
    executor.during = lambda: supervisor.request_scale(ScaleRequest("worker", 1), outcomes.append)
    recorder.hooks[("worker.1", TaskState.SCALED_DOWN)] = lambda: end_all(executor)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED, result.detail
    assert [d for _, n, old, new, d in recorder.tasks if n == "worker.1" and new is TaskState.SCALED_DOWN] == \
        ["scaled down before it ran (again)"]
    assert [o.error for o in outcomes] == ["", ""], outcomes


def test_a_deferred_start_is_not_asked_again_once_training_is_over(tmp_path):
    supervisor, executor, recorder = deferring(tmp_path, "worker.1", deferrals=10 ** 9)
    executor.during = lambda: executor.handle("ps.0").exit(0)  # every ps finished: training is over
    supervisor.run()
    [detail] = [d for _, n, _, new, d in recorder.tasks if n == "worker.1" and new is TaskState.FAILED]
    assert detail == "exit 255; not restarted: training was over (every ps had finished), so it would find no ps" \
                     " to train with", detail
    assert executor.deferred == 1  # not asked again once the ps had finished
