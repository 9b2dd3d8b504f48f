"""Scaling (issue 13, item 4) without processes: the count range in the spec and --workers,
`shoal scale`'s argument, the scaling rules, a task added to a plan, the request files
between `shoal scale` and the launcher, the records of added tasks and of the ps's
membership, and the membership line parser."""

import json
import os
import re
import sqlite3
import threading

import pytest

from shoal.cli.cmd_scale import parse_assignment
from shoal.cli.errors import UsageError
from shoal.cli.main import build_parser
from shoal.cluster import TaskId, parse_tf_config
from shoal.launch.allocation import TaskAllocation
from shoal.launch.errors import ScaleError, SpecError
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.membership_line import parse_membership
from shoal.launch.plan import added_task, format_plan, make_plan
from shoal.launch.records import JobStore
from shoal.launch.records_schema import SCHEMA_VERSION
from shoal.launch.scale_requests import (ScaleInbox, abandon, control_dir, read_answer, submit, wait_answer,
                                         withdraw)
from shoal.launch.scaling import ScaleOutcome, ScaleRequest, check_request, new_indices, to_stop
from shoal.launch.spec import load_spec, spec_from_dict
from shoal.launch.states import JobState, TaskState

from tests.unit.cli_harness import Captured, record_job

pytestmark = pytest.mark.timeout(30)


def spec(count, **roles):
    return spec_from_dict({"name": "s", "run": "python t.py",
                           "roles": {"worker": {"count": count}, **roles}})


def plan_of(count, tmp_path, **roles):
    job = spec(count, **roles)
    return make_plan(job, LocalExecutor(python="/py", gpu_count=0).allocate(job), job_id="s-1",
                     shoal_home=tmp_path, workdir=tmp_path, secret="k")


# --- the spec and the command line ---------------------------------------------------

def test_a_count_range_starts_its_minimum_and_keeps_the_range():
    job = spec("2..8")
    assert job.count("worker") == 2 and job.scale_ranges() == (("worker", 2, 8),)
    assert job.role("worker").count_range == (2, 8)


def test_a_plain_count_keeps_its_meaning_and_does_not_scale():
    job = spec(3)
    assert job.count("worker") == 3 and job.scale_ranges() == ()


@pytest.mark.parametrize("written, words", [
    ("8..2", ["'8..2'", "8..2", "e.g. 2..8"]),
    ("0..x", ["'0..x'", "MIN..MAX"]),
    ("0..0", ["'0..0'", "maximum must be 1 or more"]),
    ("2...4", ["'2...4'", "MIN..MAX"]),
])
def test_a_bad_range_names_the_value_and_the_fix(written, words):
    with pytest.raises(SpecError) as e:
        spec(written)
    assert e.value.field == "roles.worker.count"
    for word in words:
        assert word in str(e.value)


def test_a_range_from_0_needs_a_chief_and_says_so():
    assert spec("0..4", chief={}).scale_ranges() == (("worker", 0, 4),)
    with pytest.raises(SpecError) as e:
        spec("0..4")
    for word in ("0..4", "no chief", "1..4", "--chief"):
        assert word in str(e.value)


def test_a_bad_range_in_yaml_names_its_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: s\nrun: python t.py\nroles:\n  worker:\n    count: 8..2\n")
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.line == 5 and "starts above its end" in str(e.value)


@pytest.mark.parametrize("role, words", [
    ("chief", ["roles.chief.count", "one chief"]),
    ("evaluator", ["roles.evaluator.count", "only workers scale"]),
])
def test_a_range_for_a_role_other_than_worker_or_ps_is_refused_saying_why(role, words):
    with pytest.raises(SpecError) as e:
        spec(1, **{role: {"count": "1..2"}})
    for word in words:
        assert word in str(e.value)


def test_a_range_comes_from_a_parameter_too():
    job = spec_from_dict({"name": "s", "run": "x", "parameters": {"workers": "2..4"},
                          "roles": {"worker": {"count": "{{ workers }}"}}})
    assert job.scale_ranges() == (("worker", 2, 4),)


def test_the_plan_keeps_the_range_and_the_dry_run_prints_it(tmp_path):
    plan = plan_of("2..4", tmp_path)
    assert plan.scale_range("worker") == (2, 4) and plan.scale_range("ps") is None
    assert [t.name for t in plan.tasks] == ["worker.0", "worker.1"]
    assert "scale:      worker 2..4" in format_plan(plan)


def test_run_workers_takes_a_range(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2..3", "--ps", "0", "--dry-run", "--", "python", "t.py") == 0
    text = shoal.text()
    assert "# job.worker.1 " in text and "# job.worker.2 " not in text
    assert "scale:      worker 2..3" in text


def test_run_workers_refuses_a_bad_range_naming_it(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "4..1", "--dry-run", "--", "python", "t.py") == 2
    assert "'4..1'" in shoal.err.getvalue() and "MIN..MAX" in shoal.err.getvalue()


@pytest.mark.parametrize("text, expected", [("worker=4", ScaleRequest("worker", 4)),
                                            ("ps=2", ScaleRequest("ps", 2))])
def test_a_scale_assignment_parses(text, expected):
    assert parse_assignment(text) == expected


@pytest.mark.parametrize("text, words", [("wrker=2", ["'wrker'", "did you mean worker"]),
                                         ("worker", ["ROLE=N"]),
                                         ("worker=-1", ["'-1' in 'worker=-1' is not a count of tasks (0, 1, 2, ...)"]),
                                         ("worker=x", ["'x'", "not a count of tasks", "write e.g. worker=4"])])
def test_a_bad_scale_assignment_is_a_usage_error_naming_it(text, words):
    with pytest.raises(UsageError) as e:
        parse_assignment(text)
    for word in words:
        assert word in str(e.value)


def test_scale_help_says_what_it_does_and_what_does_not_scale(tmp_path):
    shoal = Captured(tmp_path)
    text = build_parser().commands["scale"].format_help()
    assert "ROLE=N" in text and "MIN..MAX" in text and "not for Slurm jobs yet" in text
    assert "Only workers scale" in text
    assert shoal("scale", "--help") == 0


def test_scale_of_a_job_that_is_not_running_says_so(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "m-20260101-000000-abcd", state=JobState.SUCCEEDED)
    assert shoal("scale", "m", "worker=2") == 6
    assert "is not running (SUCCEEDED)" in shoal.err.getvalue() and "no job is running" not in shoal.err.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("scale", "worker=2") == 6  # no JOB: the newest, which is not running
    assert "no job is running, and the newest, job 1" in shoal.err.getvalue() and ", is not running" in shoal.err.getvalue()


def test_scale_times_out_naming_the_launcher_when_nobody_answers(tmp_path):
    shoal = Captured(tmp_path)
    plan = record_job(shoal, "m-20260101-000000-abcd", running=True)  # this process: no inbox
    assert shoal("scale", "m", "worker=2", "--timeout", "0.3") == 6
    err = shoal.err.getvalue()
    assert "did not take the request worker=2 within 0.3s" in err and "nothing changed" in err
    assert not list(control_dir(plan.job_dir).glob("*.request"))  # withdrawn


def test_scale_says_the_launcher_took_the_request_when_the_job_ends_before_its_answer(tmp_path):
    shoal = Captured(tmp_path)
    job_id = "m-20260101-000000-abcd"
    plan = record_job(shoal, job_id, running=True)
    replies: list = []

    def serve(request, reply) -> None:  # the launcher claims it, then the job ends before it answers
        replies.append(reply)
        with shoal.env.store() as store:
            store.set_job_state(job_id, JobState.SUCCEEDED, "done", exit_code=0, ended=True)

    inbox = ScaleInbox(plan.job_dir, serve, poll=0.02)
    inbox.start()
    try:
        assert shoal("scale", "m", "worker=2", "--timeout", "10") == 6
        err = shoal.err.getvalue()
        assert "had taken the request worker=2" in err and "nothing was changed" not in err
        replies[0](ScaleOutcome("worker", 2, 1, started=("worker:1",)))  # the answer comes late
    finally:
        inbox.close()
    assert list(control_dir(plan.job_dir).iterdir()) == []  # no answer is left behind


def test_an_answer_the_client_gave_up_on_is_removed(tmp_path):
    token = submit(tmp_path, ScaleRequest("worker", 3))
    replies: list = []
    inbox = ScaleInbox(tmp_path, lambda request, reply: replies.append(reply))
    assert inbox.poll_once() == 1 and withdraw(tmp_path, token) is False  # claimed
    assert abandon(tmp_path, token) is None
    replies[0](ScaleOutcome("worker", 3, 2, started=("worker:2",)))
    assert list(control_dir(tmp_path).iterdir()) == []


def test_abandoning_a_request_already_answered_returns_the_answer(tmp_path):
    token = submit(tmp_path, ScaleRequest("worker", 3))
    inbox = ScaleInbox(tmp_path, lambda request, reply: reply(ScaleOutcome("worker", 3, 2,
                                                                            started=("worker:2",))))
    assert inbox.poll_once() == 1
    assert abandon(tmp_path, token).started == ("worker:2",)
    assert list(control_dir(tmp_path).iterdir()) == []


# --- the rules ---------------------------------------------------------------------

def test_new_indices_are_above_every_index_that_ever_ran():
    assert new_indices([0, 1, 3], 2) == [4, 5] and new_indices([], 1) == [0]


def test_scale_down_stops_the_highest_indices_and_never_the_primary():
    live = [TaskId("worker", i) for i in (0, 1, 4, 2)]
    assert to_stop(live, 2, TaskId("worker", 0)) == [TaskId("worker", 4), TaskId("worker", 2)]
    assert to_stop(live[:1], 1, TaskId("worker", 0)) == []


@pytest.mark.parametrize("request_, scale_range, kind, can_add, words", [
    (ScaleRequest("worker", 9), (2, 8), "local", True, ["worker=9", "range 2..8", "from 2 to 8"]),
    (ScaleRequest("worker", 1), (2, 8), "local", True, ["range 2..8"]),
    (ScaleRequest("worker", 4), None, "local", True, ["fixed at 3", "roles.worker.count: MIN..MAX"]),
    (ScaleRequest("ps", 2), (2, 8), "local", True, ["only workers scale", "re-homing"]),
    (ScaleRequest("worker", 4), (2, 8), "slurm", False,
     ["shoal scale is not supported for Slurm jobs yet"]),
])
def test_a_request_the_job_cannot_take_is_refused_saying_why(request_, scale_range, kind, can_add, words):
    with pytest.raises(ScaleError) as e:
        check_request(request_, scale_range, 3, kind, can_add)
    for word in words:
        assert word in str(e.value)


def test_an_outcome_reads_as_the_cli_prints_it_and_survives_json():
    up = ScaleOutcome("worker", 4, 2, started=("worker:2", "worker:3"))
    assert up.describe() == "worker=4 (was 2): started worker:2, worker:3"
    assert ScaleOutcome.from_json(json.loads(json.dumps(up.as_json()))) == up
    with pytest.raises(ValueError):
        ScaleOutcome.from_json({"role": "worker"})


def test_an_added_task_lists_the_tasks_as_they_are_plus_itself(tmp_path):
    plan = plan_of("2..4", tmp_path, ps={"count": 1})
    peers = [t for t in plan.tasks if t.name != "worker.1"]  # worker.1 was scaled down
    task = added_task(plan, TaskAllocation(TaskId("worker", 2), "127.0.0.1", 4242), peers)
    config = parse_tf_config(task.env_dict["TF_CONFIG"])
    assert config.task == TaskId("worker", 2)
    assert config.cluster.task_indices("worker") == (0, 2)
    assert config.cluster.task_address("worker", 2) == "127.0.0.1:4242"
    assert config.cluster.job_tasks("ps") == [plan.tasks[0].address]
    env = task.env_dict
    assert (env["SHOAL_TASK"], env["RANK"], env["WORLD_SIZE"]) == ("worker:2", "1", "2")
    assert env["SHOAL_JOB_SECRET"] == "k" and task.argv == plan.tasks[1].argv
    assert task.log_path.endswith("/logs/worker.2.log") and task.label == "s.worker.2"


# --- the request files ---------------------------------------------------------------

def test_a_request_is_served_and_answered_through_the_job_folder(tmp_path):
    served = []

    def serve(request, reply):
        served.append(request)
        reply(ScaleOutcome(request.role, request.count, 2, started=("worker:2",)))

    inbox = ScaleInbox(tmp_path, serve)
    token = submit(tmp_path, ScaleRequest("worker", 3))
    assert inbox.poll_once() == 1 and served == [ScaleRequest("worker", 3)]
    assert read_answer(tmp_path, token).started == ("worker:2",)
    assert read_answer(tmp_path, token) is None  # read once
    assert os.stat(control_dir(tmp_path)).st_mode & 0o777 == 0o700


def test_a_withdrawn_request_is_never_served(tmp_path):
    inbox = ScaleInbox(tmp_path, lambda request, reply: pytest.fail("served"))
    token = submit(tmp_path, ScaleRequest("worker", 3))
    assert withdraw(tmp_path, token) is True and withdraw(tmp_path, token) is False
    assert inbox.poll_once() == 0


def test_a_malformed_request_gets_an_error_answer(tmp_path):
    inbox = ScaleInbox(tmp_path, lambda request, reply: pytest.fail("served"))
    control_dir(tmp_path).mkdir()
    (control_dir(tmp_path) / "scale-abc.request").write_text('{"role": "worker", "count": true}')
    inbox.poll_once()
    answer = read_answer(tmp_path, "abc")
    assert not answer.ok and "count must be a whole number" in answer.error


def test_the_inbox_thread_answers_a_waiting_client(tmp_path):
    inbox = ScaleInbox(tmp_path, lambda request, reply: reply(ScaleOutcome("worker", 2, 4,
                                                                           stopping=("worker:3",))),
                       poll=0.02)
    inbox.start()
    try:
        token = submit(tmp_path, ScaleRequest("worker", 2))
        answer = wait_answer(tmp_path, token, 10.0, lambda: True)
    finally:
        inbox.close()
        inbox.close()
    assert answer is not None and answer.stopping == ("worker:3",)


def test_waiting_ends_when_the_job_ends(tmp_path):
    token = submit(tmp_path, ScaleRequest("worker", 2))
    ended = threading.Event()
    ended.set()
    assert wait_answer(tmp_path, token, 10.0, lambda: not ended.is_set()) is None


# --- the records -------------------------------------------------------------------

def test_an_added_task_is_recorded_after_the_others(tmp_path):
    plan = plan_of("1..3", tmp_path)
    extra = added_task(plan, TaskAllocation(TaskId("worker", 1), "127.0.0.1", 4243), plan.tasks)
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan, 1, 0.0)
        store.add_task(plan.job_id, extra)
        store.set_task(plan.job_id, "worker.1", TaskState.SCALED_DOWN, "scaled down (exit 0)", 0)
        job = store.find(plan.job_id)
    assert [t.name for t in job.tasks] == ["worker.0", "worker.1"]
    assert job.task("worker.1").state is TaskState.SCALED_DOWN and TaskState.SCALED_DOWN.is_terminal


def test_the_membership_is_recorded_and_read_back_as_task_names(tmp_path):
    plan = plan_of(1, tmp_path)
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan, 1, 0.0)
        assert store.find(plan.job_id).membership_version is None
        store.set_membership(plan.job_id, 3, "chief:0, worker:0", "worker:1 left", 1.0)
        job = store.find(plan.job_id)
    assert (job.membership_version, job.members, job.membership_change) == (
        3, ("chief.0", "worker.0"), "worker:1 left")
    assert job.as_json()["membership_version"] == 3


def test_a_version_3_job_store_is_migrated_to_keep_the_membership(tmp_path):
    path = tmp_path / "jobs.db"
    plan = plan_of(1, tmp_path)
    with JobStore(path) as store:
        store.create_job(plan, 1, 0.0)
    with sqlite3.connect(path) as db:  # back to version 3: without the membership columns
        for column in ("membership_version", "membership_tasks", "membership_change", "membership_at"):
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 3")
    with JobStore(path) as store:
        store.set_membership(plan.job_id, 1, "worker:0", "", 1.0)
        assert store.find(plan.job_id).membership_version == 1
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_status_shows_the_membership_and_who_trains(tmp_path):
    shoal = Captured(tmp_path)
    plan = record_job(shoal, "m-20260101-000000-abcd", workers=2)
    with shoal.env.store() as store:
        store.set_membership(plan.job_id, 3, "worker:0", "worker:1 left (no heartbeat for 20s)", 1.0)
    assert shoal("status", "m") == 0
    lines = shoal.out.getvalue().splitlines()
    assert "membership v3 (ps:0): 1 training [worker:0]; worker:1 left (no heartbeat for 20s)" in lines
    header = next(line for line in lines if line.startswith("TASK"))
    assert header.split()[:3] == ["TASK", "STATE", "MEMBER"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("m.worker")}
    assert rows["m.worker.0"][2] == "training" and rows["m.worker.1"][2] == "out"  # running, dropped by the ps
    with shoal.env.store() as store:  # worker.0 ended after ps:0's last membership line
        store.set_task(plan.job_id, "worker.0", TaskState.KILLED, "killed by SIGKILL", 0)
    shoal = Captured(tmp_path)
    assert shoal("status", "m") == 0
    rows = {line.split()[0]: line.split() for line in shoal.out.getvalue().splitlines() if line.startswith("m.worker")}
    assert rows["m.worker.0"][2] == "-"


# --- the membership line ---------------------------------------------------------------

def test_a_membership_line_parses_with_its_change():
    line = parse_membership(b"2026-01-01 12:00:00,000 INFO ps:0 membership v3: 2 training"
                            b" [chief:0, worker:0]; worker:1 left (no heartbeat for 20s)\n")
    assert line is not None
    assert (line.reporter, line.version, line.count) == ("ps:0", 3, 2)
    assert line.tasks == ("chief:0", "worker:0")
    assert line.change == "worker:1 left (no heartbeat for 20s)"
    assert line.tasks_text == "chief:0, worker:0"


def test_a_membership_line_without_a_change_or_members_parses():
    line = parse_membership(b"ps:1 membership v1: 0 training []")
    assert line is not None and (line.reporter, line.version, line.tasks, line.change) == (
        "ps:1", 1, (), "")


@pytest.mark.parametrize("text", [
    b"worker:0 step=10 loss=0.5",
    b"ps:0 membership v3: 2 training chief:0, worker:0",
    b"ps:0 membership vX: 2 training [worker:0]",
    b"ps:0 membership v3: 2 training [worker 0, bogus]",
])
def test_other_lines_are_not_membership_lines(text):
    assert parse_membership(text) is None


def test_scale_usage_shows_one_assignment_and_every_option(tmp_path, capsys):
    assert Captured(tmp_path)("scale", "--help") == 0
    text = capsys.readouterr().out
    usage = text.split("\n\n")[0]
    assert usage == "usage: shoal scale [-h] [--timeout S] [JOB] ROLE=N"
    options = set(re.findall(r"^  (-[-\w]+)", text, re.M))
    assert options and all(option in usage for option in options), (options, usage)
