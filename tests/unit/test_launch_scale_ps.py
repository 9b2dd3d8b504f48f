"""Adding ps to a running job (issue 14, launcher side) without processes: the ps count range
in the spec and `shoal run --ps`, the refusal of a ps scale-down, the job's ps list
(PsRoster) and the TF_CONFIG of an added ps and of tasks started after it, the supervisor's
ps scale-up and teardown with the fake executor, and where an ssh job puts an added ps."""

import signal

import pytest

from shoal.cluster import TaskId, parse_tf_config
from shoal.launch.allocation import TaskAllocation
from shoal.launch.errors import PlanError, ScaleError, SpecError
from shoal.launch.hosts import Host, host_for_added
from shoal.launch.plan import added_task
from shoal.launch.ps_roster import PsRoster
from shoal.launch.scaling import ScaleRequest, check_request
from shoal.launch.spec import spec_from_dict
from shoal.launch.states import JobState, TaskState
from tests.unit.cli_harness import Captured
from tests.unit.test_launch_supervisor import RUN, plan_of
from tests.unit.test_launch_supervisor_scale import PlacingExecutor, ask, end_all, scaled

pytestmark = pytest.mark.timeout(30)


def spec(ps, **roles):
    return spec_from_dict({"name": "s", "run": "python t.py",
                           "roles": {"worker": {"count": 1}, "ps": {"count": ps}, **roles}})


def ps_list(plan) -> list:
    return parse_tf_config(plan.env_dict["TF_CONFIG"]).cluster.job_tasks("ps")


class RolePorts(PlacingExecutor):
    """Places added tasks on ports by role and index (ps:2 and worker:2 must not share one)."""

    def place_task(self, job, task: TaskId, running) -> TaskAllocation:
        self.placed_among[task.index] = [t.name for t in running]
        return TaskAllocation(task, "127.0.0.1", (6000 if task.job == "ps" else 5000) + task.index)


def asking_for_ps(tmp_path, roles, count, scripts=None, **options):
    """`scaled` with RolePorts, whose job asks for `count` ps once worker.0 runs. Returns the
    supervisor, executor, recorder, output, and the list the scale outcomes go to."""
    supervisor, executor, recorder, out = scaled(tmp_path, roles, scripts or {}, executor_class=RolePorts,
                                                 **options)
    outcomes: list = []
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "ps", count)
    return supervisor, executor, recorder, out, outcomes


def chief_exits_once_running(recorder, executor, name, code):
    """Once task `name` runs, chief.0 exits with `code`."""
    recorder.hooks[(name, TaskState.RUNNING)] = lambda: executor.handle("chief.0").exit(code)


# --- the spec and the command line ---------------------------------------------------

def test_a_ps_count_range_starts_its_minimum_and_keeps_the_range():
    job = spec("2..4")
    assert job.count("ps") == 2 and job.scale_ranges() == (("ps", 2, 4),)


def test_a_ps_range_from_0_is_refused_saying_why():
    with pytest.raises(SpecError) as e:
        spec("0..2")
    for word in ("roles.ps.count: 0..2", "no ps", "registers with ps 0", "1..2"):
        assert word in str(e.value)


def test_run_ps_takes_a_range(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--ps", "2..3", "--dry-run", "--", "python", "t.py") == 0
    text = shoal.text()
    assert "# job.ps.1 " in text and "# job.ps.2 " not in text
    assert "scale:      ps 2..3 (shoal scale JOB ps=N)" in text


def test_run_ps_refuses_a_bad_range_naming_it(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--ps", "3..1", "--dry-run", "--", "python", "t.py") == 2
    assert "'3..1'" in shoal.err.getvalue() and "MIN..MAX" in shoal.err.getvalue()


# --- the rules -----------------------------------------------------------------------

def test_a_ps_scale_down_is_refused_saying_why_and_what_to_do():
    with pytest.raises(ScaleError) as e:
        check_request(ScaleRequest("ps", 1), (1, 4), 2, "local", True)
    text = str(e.value)
    for word in ("ps=1 (was 2)", "scales up only", "only workers scale down", "never stops a single ps",
                 "--ps_recovery_timeout", "re-homing", "shoal kill", "roles.ps.count", "checkpoint"):
        assert word in text


@pytest.mark.parametrize("count", [2, 3])
def test_a_ps_scale_up_or_to_the_same_count_within_the_range_is_allowed(count):
    check_request(ScaleRequest("ps", count), (2, 4), 2, "local", True)


def test_a_ps_scale_up_of_a_slurm_job_is_refused_as_for_workers():
    with pytest.raises(ScaleError) as ps:
        check_request(ScaleRequest("ps", 3), (2, 4), 2, "slurm", False)
    with pytest.raises(ScaleError) as worker:
        check_request(ScaleRequest("worker", 3), (2, 4), 2, "slurm", False)
    assert str(ps.value) == str(worker.value)
    assert "not supported for Slurm jobs yet" in str(ps.value)


def test_the_ps_roster_takes_only_the_next_index():
    roster = PsRoster(("h:1", "h:2"))
    assert roster.added(TaskId("ps", 2), "h:3").addresses == ("h:1", "h:2", "h:3")
    for task in (TaskId("ps", 3), TaskId("ps", 1), TaskId("worker", 2)):
        with pytest.raises(PlanError) as e:
            roster.added(task, "h:9")
        assert str(task) in str(e.value) and "next ps is ps:2" in str(e.value)


def test_an_added_ps_lists_every_ps_with_itself_at_its_index(tmp_path):
    plan = plan_of(tmp_path, {"ps": {"count": "2..3"}, "worker": {"count": 2}})
    roster = PsRoster.of_tasks(plan.tasks).added(TaskId("ps", 2), "127.0.0.1:7002")
    task = added_task(plan, TaskAllocation(TaskId("ps", 2), "127.0.0.1", 7002), plan.tasks,
                      roster.addresses)
    config = parse_tf_config(task.env_dict["TF_CONFIG"])
    assert config.task == TaskId("ps", 2)
    assert config.cluster.job_tasks("ps") == ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:7002"]
    assert config.cluster.job_tasks("worker") == ["127.0.0.1:1002", "127.0.0.1:1003"]
    assert task.name == "ps.2" and task.log_path.endswith("/logs/ps.2.log") and "RANK" not in task.env_dict


def test_a_worker_added_after_a_ps_joined_lists_the_ps_the_job_started_with(tmp_path):
    """The runtime replays the placement history from the ps the job started with; a worker
    whose cluster listed the added ps would start from another placement."""
    plan = plan_of(tmp_path, {"ps": {"count": "1..2"}, "worker": {"count": "1..2"}})
    ps1 = added_task(plan, TaskAllocation(TaskId("ps", 1), "127.0.0.1", 7001), plan.tasks,
                     PsRoster.of_tasks(plan.tasks).added(TaskId("ps", 1), "127.0.0.1:7001").addresses)
    worker = added_task(plan, TaskAllocation(TaskId("worker", 1), "127.0.0.1", 7002), [*plan.tasks, ps1],
                        PsRoster.of_tasks(plan.tasks).addresses)
    assert ps_list(worker) == ["127.0.0.1:1000"]
    assert parse_tf_config(worker.env_dict["TF_CONFIG"]).task == TaskId("worker", 1)


# --- the supervisor ------------------------------------------------------------------

def test_scale_ps_up_starts_the_next_ps_with_every_ps_in_its_tf_config(tmp_path):
    supervisor, executor, recorder, out, outcomes = asking_for_ps(
        tmp_path, {"chief": {}, "ps": {"count": "2..4"}, "worker": {"count": 1}}, 3)
    chief_exits_once_running(recorder, executor, "ps.2", 0)
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert [o.describe() for o in outcomes] == ["ps=3 (was 2): started ps:2"]
    assert recorder.added == ["ps.2"]
    config = parse_tf_config(executor.plans["ps.2"].env_dict["TF_CONFIG"])
    assert config.task == TaskId("ps", 2)
    assert config.cluster.job_tasks("ps") == ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:6002"]
    assert config.cluster.task_indices("chief") == (0,) and config.cluster.task_indices("worker") == (0,)
    assert len(ps_list(executor.plans["ps.0"])) == 2  # running tasks keep theirs
    assert b"scaled ps to 3 (was 2): started ps:2" in out.getvalue()
    final = recorder.final()  # the added ps is stopped with the others when the chief is done
    assert final["ps.2"] is TaskState.KILLED and final["ps.0"] is TaskState.KILLED
    assert executor.handle("ps.2").signals == [signal.SIGTERM]


def test_tasks_started_after_a_ps_joined_list_the_ps_the_job_started_with(tmp_path):
    supervisor, executor, recorder, _ = scaled(
        tmp_path, {"ps": {"count": "1..2"}, "worker": {"count": "1..2"}}, {"worker.0": [RUN, RUN]},
        executor_class=RolePorts, restart={"policy": "on-failure", "max_restarts": 1, "backoff": "0s"})
    outcomes: list = []
    runs: list = []

    def worker_0_runs() -> None:  # first: add a ps; once restarted: the end
        runs.append(1)
        if len(runs) == 1:
            ask(supervisor, outcomes, "ps", 2)
        else:
            end_all(executor)

    recorder.hooks[("worker.0", TaskState.RUNNING)] = worker_0_runs
    recorder.hooks[("ps.1", TaskState.RUNNING)] = lambda: ask(supervisor, outcomes, "worker", 2)
    recorder.hooks[("worker.1", TaskState.RUNNING)] = lambda: executor.handle("worker.0").exit(1)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert [o.describe() for o in outcomes] == ["ps=2 (was 1): started ps:1", "worker=2 (was 1): started worker:1"]
    assert ps_list(executor.plans["ps.1"]) == ["127.0.0.1:1000", "127.0.0.1:6001"]
    started_with = ["127.0.0.1:1000"]  # the runtime tells them of ps:1 (its placement history)
    assert ps_list(executor.plans["worker.1"]) == started_with  # added after the ps
    assert ps_list(executor.plans["worker.0"]) == started_with  # restarted after it
    assert [name for name, _ in executor.starts].count("worker.0") == 2


def test_an_added_ps_that_fails_for_good_stops_the_job_like_any_ps(tmp_path):
    supervisor, executor, recorder, _, outcomes = asking_for_ps(
        tmp_path, {"chief": {}, "ps": {"count": "1..2"}, "worker": {"count": 1}}, 2, {"ps.1": [3]})
    result = supervisor.run()
    assert result.state is JobState.FAILED and "t.ps.1 failed (exit 3)" in result.detail
    final = recorder.final()
    assert final["ps.1"] is TaskState.FAILED
    assert {final[n] for n in ("ps.0", "chief.0", "worker.0")} == {TaskState.KILLED}


def test_a_chief_that_fails_after_a_ps_joined_stops_the_added_ps_too(tmp_path):
    supervisor, executor, recorder, _, outcomes = asking_for_ps(
        tmp_path, {"chief": {}, "ps": {"count": "1..2"}, "worker": {"count": 1}}, 2)
    chief_exits_once_running(recorder, executor, "ps.1", 4)
    result = supervisor.run()
    assert result.state is JobState.FAILED and result.chief_exit == 4
    assert recorder.final()["ps.1"] is TaskState.KILLED
    assert executor.handle("ps.1").signals == [signal.SIGTERM]


def test_a_ps_scale_down_stops_nothing_and_says_why(tmp_path):
    supervisor, executor, recorder, _, outcomes = asking_for_ps(
        tmp_path, {"ps": {"count": "1..3"}, "worker": {"count": 1}}, 2)

    def shrink_then_end() -> None:
        ask(supervisor, outcomes, "ps", 1)
        supervisor._serve_scales()
        executor.handle("worker.0").exit(0)  # the ps run on until the job's end stops them (had they exited
        # too, in whichever order their watch threads report, a ps could end before that SIGTERM)

    recorder.hooks[("ps.1", TaskState.RUNNING)] = shrink_then_end
    assert supervisor.run().state is JobState.SUCCEEDED
    by_count = {o.count: o for o in outcomes}  # the second is answered inside the first's reply
    assert by_count[2].describe() == "ps=2 (was 1): started ps:1"
    assert not by_count[1].ok and "ps=1 (was 2): a ps scales up only" in by_count[1].error
    assert executor.handle("ps.1").signals == [signal.SIGTERM]  # stopped by the job's end only, not by scale


# --- where an ssh job puts an added task -----------------------------------------------

def test_an_added_ps_goes_to_the_connected_host_with_fewest_tasks_needing_no_slot():
    hosts = [Host("a", 1), Host("b", 1), Host("c", 1)]
    placed = [("a", "ps"), ("a", "worker"), ("b", "worker"), ("c", "worker"), ("c", "worker")]
    assert host_for_added(TaskId("ps", 1), hosts, {"a", "b", "c"}, placed).name == "b"
    assert host_for_added(TaskId("ps", 1), hosts, {"a", "c"}, placed).name == "a"
    with pytest.raises(PlanError) as e:  # every slot is used: a worker has nowhere to go
        host_for_added(TaskId("worker", 3), hosts, {"a", "b", "c"}, placed)
    assert "used its slots" in str(e.value)


def test_an_added_task_with_no_connected_host_is_refused_naming_the_hosts():
    with pytest.raises(PlanError) as e:
        host_for_added(TaskId("ps", 1), [Host("a"), Host("b")], set(), [])
    assert "no host of the job is connected (a, b)" in str(e.value)
