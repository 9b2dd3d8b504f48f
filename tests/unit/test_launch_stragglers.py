"""Straggler figures: the progress line's new fields (old lines still parse), the reporter's
median/p95 and applied share, the slow flag, and the records that keep them (schema 3)."""

import io
import sqlite3

from shoal.launch.progress_line import ProgressLine, parse_progress
from shoal.launch.records import JobStore, TaskRecord
from shoal.launch.records_schema import SCHEMA_VERSION
from shoal.launch.states import TaskState
from shoal.launch.stragglers import figures
from shoal.train.progress import ProgressReporter, step_time_ms
from tests.unit.test_launch_supervisor import plan_of


def task(name, step_ms=None, applied=None, pushed=None, p95_ms=None):
    return TaskRecord(name, f"j.{name}", "127.0.0.1:1", TaskState.RUNNING, 1, 0, "", "/l",
                      step_ms=step_ms, p95_ms=p95_ms, applied=applied, pushed=pushed)


def test_an_old_progress_line_parses_without_figures():
    assert parse_progress(b"worker:0 step=12 loss=0.5 examples/s=80 checkpoints=2") == ProgressLine(12, 0.5)


def test_a_new_progress_line_parses_with_its_figures():
    line = b"worker:1 step=200 loss=0.3012 examples/s=812 step_ms=12.1 p95_ms=19.8 applied=95/100 checkpoints=3"
    assert parse_progress(line) == ProgressLine(200, 0.3012, 12.1, 19.8, 95, 100)


def test_step_time_ms_is_the_median_and_nearest_rank_p95():
    assert step_time_ms([0.01] * 19 + [1.0]) == (10.0, 10.0)
    assert step_time_ms([0.01] * 18 + [1.0, 2.0]) == (10.0, 1000.0)
    assert step_time_ms([]) == (0.0, 0.0)


class _Session:
    task = "worker:1"
    summaries = None
    checkpointer = None


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_reporter_prints_step_times_and_the_applied_share_after_the_old_fields():
    clock, out = _Clock(), io.StringIO()
    reporter = ProgressReporter(_Session(), every=4, batch_size=10, out=out, clock=clock)
    for i, (seconds, applied) in enumerate([(0.01, True), (0.02, False), (0.03, True), (0.5, True)]):
        clock.now += seconds
        reporter.step_done(1.0, i, applied)
    line = out.getvalue()
    assert line.startswith("worker:1 step=3 loss=1.0000 examples/s=")
    assert line.endswith(" step_ms=25.0 p95_ms=500.0 applied=3/4\n")
    assert parse_progress(line.encode()) == ProgressLine(3, 1.0, 25.0, 500.0, 3, 4)


def test_reporter_leaves_applied_out_when_the_caller_does_not_say():
    out = io.StringIO()
    ProgressReporter(_Session(), every=1, batch_size=10, out=out).step_done(0.5, 1)
    assert "applied=" not in out.getvalue() and "step_ms=" in out.getvalue()


def test_a_worker_over_one_and_a_half_times_the_others_median_is_flagged():
    shown = figures([task("ps.0"), task("worker.0", 10), task("worker.1", 11), task("worker.2", 40)])
    assert [f.name for f in shown if f.slow] == ["worker.2"]
    slow = shown[3]
    assert round(slow.slow_by, 2) == round(40 / 10.5, 2) and slow.flag_text() == "SLOW x3.8"
    assert shown[0].step_text() == "-" and not shown[0].slow


def test_no_flag_within_one_and_a_half_times_or_with_a_single_worker():
    assert not any(f.slow for f in figures([task("worker.0", 10), task("worker.1", 15)]))
    assert not any(f.slow for f in figures([task("worker.0", 100)]))


def test_a_slow_backup_worker_says_how_many_steps_it_was_dropped_from():
    shown = figures([task("worker.0", 10, 100, 100), task("worker.1", 10, 98, 100),
                     task("worker.2", 30, 60, 100, p95_ms=45)])
    assert shown[2].flag_text() == "SLOW x3.0, dropped from 40 steps"
    assert shown[2].applied_text() == "60/100 (60%)" and shown[2].step_text() == "30.0/45.0"
    assert shown[2].as_json()["dropped"] == 40 and shown[1].flag_text() == ""


def test_task_figures_are_recorded_and_read_back(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        plan = plan_of(tmp_path, {"worker": {"count": 2}})
        store.create_job(plan, 1, 0.0)
        store.set_task_progress(plan.job_id, "worker.1", 12.5, 30.0, 9, 10, 123.0)
        store.set_task_progress(plan.job_id, "worker.1", None, None, None, None, 124.0)  # an old line
        t = store.find(plan.job_id).task("worker.1")
        assert (t.step_ms, t.p95_ms, t.applied, t.pushed, t.progress_at) == (12.5, 30.0, 9, 10, 124.0)
        assert store.find(plan.job_id).task("worker.0").step_ms is None


def test_a_version_2_job_store_is_migrated_to_keep_task_figures(tmp_path):
    path = tmp_path / "jobs.db"
    with JobStore(path) as store:
        plan = plan_of(tmp_path, {"worker": {}})
        store.create_job(plan, 1, 0.0)
    with sqlite3.connect(path) as db:  # back to version 2: without the figure (and v4 membership) columns
        for column in ("step_ms", "p95_ms", "applied", "pushed", "progress_at"):
            db.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
        for column in ("membership_version", "membership_tasks", "membership_change", "membership_at"):
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 2")
    with JobStore(path) as store:
        assert store.find(plan.job_id).task("worker.0").step_ms is None
        store.set_task_progress(plan.job_id, "worker.0", 5.0, 6.0, 1, 1, 1.0)
        assert store.find(plan.job_id).task("worker.0").step_ms == 5.0
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_monitor_adds_the_figure_columns_only_when_a_task_reports_them():
    from shoal.cli.cmd_monitor import samples_table
    from shoal.launch.monitor import TaskSample

    samples = [TaskSample(n, TaskState.RUNNING, 1, None) for n in ("ps.0", "worker.0", "worker.1")]
    plain = samples_table(samples, figures([task("ps.0"), task("worker.0"), task("worker.1")]))
    assert plain.splitlines()[0].split()[-2:] == ["GPU", "MEM"]
    shown = samples_table(samples, figures([task("ps.0"), task("worker.0", 10, 5, 5), task("worker.1", 40, 5, 5)]))
    lines = shown.splitlines()
    assert lines[0].split()[-5:] == ["STEP", "MS", "MED/P95", "APPLIED", "FLAG"]
    assert lines[3].split()[:2] == ["worker.1", "RUNNING"] and lines[3].split()[-5:] == [
        "40.0", "5/5", "(100%)", "SLOW", "x4.0"]


def test_monitor_shows_each_tasks_host_only_when_some_task_runs_elsewhere():
    from shoal.cli.cmd_monitor import samples_table
    from shoal.launch.monitor import TaskSample

    here = samples_table([TaskSample("worker.0", TaskState.RUNNING, 7, None)])
    assert "HOST" not in here.splitlines()[0]
    remote = samples_table([TaskSample("ps.0", TaskState.RUNNING, 7, None, "node1"),
                            TaskSample("worker.0", TaskState.RUNNING, 8, None, "node2")])
    lines = remote.splitlines()
    assert lines[0].split()[:4] == ["TASK", "STATE", "HOST", "PID"]
    assert lines[2].split()[:4] == ["worker.0", "RUNNING", "node2", "8"]


def test_a_task_scaled_down_or_moved_is_not_flagged_nor_compared():
    gone = TaskRecord("worker.2", "j.worker.2", "127.0.0.1:1", TaskState.SCALED_DOWN, 1, 0, "", "/l", step_ms=40.0)
    moved = TaskRecord("worker.3", "j.worker.3", "127.0.0.1:1", TaskState.MOVED, 1, 0, "", "/l", step_ms=90.0)
    shown = figures([task("worker.0", 10), task("worker.1", 11), gone, moved])
    assert not any(f.slow for f in shown)
    assert shown[2].step_ms == 40.0  # still shown, as measured
    assert [f.name for f in figures([task("worker.0", 10), task("worker.1", 40), moved]) if f.slow] == ["worker.1"]
