"""JobStore: jobs newest first, lookup by id, prefix or name; states and processes."""

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from shoal.launch.errors import JobNotFound, LaunchError, WorkspaceError
from shoal.launch.executor import TaskRef
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import make_plan
from shoal.launch.records import JobStore
from shoal.launch.records_schema import SCHEMA_VERSION
from shoal.launch.spec import spec_from_dict
from shoal.launch.states import JOB_TRANSITIONS, TASK_TRANSITIONS, JobState, TaskState


def plan(job_id, name="m"):
    spec = spec_from_dict({"name": name, "run": "true", "roles": {"worker": {"count": 2}}})
    return make_plan(spec, LocalExecutor(python="/py").allocate(spec), job_id=job_id,
                     shoal_home=Path("/h"), workdir=Path("/w"))


def test_jobs_are_listed_newest_first_and_found_by_id_prefix_or_name(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("m-1"), 1, 0.0)
        store.create_job(plan("m-2"), 1, 0.0)
        store.create_job(plan("x-1", "x"), 1, 0.0)
        assert [j.id for j in store.list_jobs()] == ["x-1", "m-2", "m-1"]
        assert store.find("m-1").id == "m-1" and store.find("x").id == "x-1"
        with pytest.raises(JobNotFound, match="ambiguous"):
            store.find("m-")
        with pytest.raises(JobNotFound, match="no job 'zzz'"):
            store.find("zzz")


def test_states_processes_and_progress_are_recorded(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("m-1"), 1, 0.0)
        ref = TaskRef("local", pid=42, started=1.5)
        store.set_task("m-1", "worker.1", TaskState.RUNNING, "pid 42", 0, ref)
        store.add_process("m-1", "worker.1", ref)
        store.set_progress("m-1", 100, 0.25)
        store.set_job_state("m-1", JobState.SUCCEEDED, "done", exit_code=0, ended=True)
        job = store.find("m-1")
        assert job.state == "SUCCEEDED" and job.exit_code == 0 and job.ended is not None
        assert (job.step, job.loss) == (100, 0.25)
        assert job.task("worker.1").pid == 42 and job.task("worker.0").state == "PENDING"
        assert [(p.name, p.ref.pid) for p in store.processes("m-1")] == [("worker.1", 42)]
        assert job.as_json()["tasks"][1]["name"] == "worker.1"


def test_a_job_recorded_while_queued_keeps_its_record_and_number_when_its_tasks_are_recorded(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("m-0"), 1, 0.0)
        number = store.create_queued("m-1", "m", "/h/jobs/m-1", 7, 1.5, "slurm", "Slurm job 42 is PENDING (Resources)")
        queued = store.find("m-1")
        assert (queued.number, queued.state, queued.tasks, queued.executor) == (2, JobState.PENDING, (), "slurm")
        assert queued.reason == "Slurm job 42 is PENDING (Resources)" and queued.launcher_pid == 7
        assert store.create_job(plan("m-1"), 7, 1.5, executor="slurm") == number == 2
        job = store.find("m-1")
        assert job.reason == "" and [t.name for t in job.tasks] == ["worker.0", "worker.1"]
        assert job.model_dir == plan("m-1").model_dir and len(store.list_jobs()) == 2
        assert store.create_job(plan("m-2"), 1, 0.0) == 3


def test_terminal_states_have_no_transitions():
    for state in TaskState:
        assert (not TASK_TRANSITIONS[state]) == state.is_terminal
    for state in JobState:
        assert (not JOB_TRANSITIONS[state]) == state.is_terminal


def test_job_store_files_are_private(tmp_path):
    home = tmp_path / "home"
    with JobStore(home / "jobs.db") as store:
        store.create_job(plan("m-1"), 1, 0.0)
        for name in ("jobs.db", "jobs.db-wal", "jobs.db-shm"):
            assert stat.S_IMODE(os.stat(home / name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700


def test_an_existing_world_readable_job_store_is_made_private(tmp_path):
    (tmp_path / "jobs.db").touch(mode=0o644)
    os.chmod(tmp_path / "jobs.db", 0o644)
    with JobStore(tmp_path / "jobs.db") as store:
        assert store.list_jobs() == []
    assert stat.S_IMODE(os.stat(tmp_path / "jobs.db").st_mode) == 0o600


OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
  ended REAL, exit_code INTEGER, reason TEXT NOT NULL DEFAULT '',
  launcher_pid INTEGER, launcher_started REAL, job_dir TEXT NOT NULL,
  model_dir TEXT NOT NULL, step INTEGER, loss REAL
);
CREATE TABLE IF NOT EXISTS tasks (
  job_id TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, address TEXT NOT NULL,
  state TEXT NOT NULL, pid INTEGER, restarts INTEGER NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT '', log_path TEXT NOT NULL, position INTEGER NOT NULL,
  PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS processes (
  job_id TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER NOT NULL, started REAL
);
"""


def test_an_unversioned_job_store_is_migrated_and_its_jobs_read(tmp_path):
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:  # as the first shoal wrote it
        db.executescript(OLD_SCHEMA)
        db.execute("INSERT INTO jobs VALUES ('old-1', 'old', 'FAILED', 10.0, 20.0, 3,"
                   " 'old.chief.0 failed (exit 3)', 77, 9.5, '/h/jobs/old-1',"
                   " '/h/jobs/old-1/model', 40, 0.5)")
        db.executemany("INSERT INTO tasks VALUES ('old-1', ?, ?, '127.0.0.1:1', ?, ?, ?, '',"
                       " '/h/log', ?)",
                       [("chief.0", "old.chief.0", "FAILED", 101, 1, 0),
                        ("ps.0", "old.ps.0", "KILLED", 102, 0, 1)])
        db.executemany("INSERT INTO processes VALUES ('old-1', ?, ?, ?)",
                       [("chief.0", 100, 11.0), ("chief.0", 101, 12.0), ("ps.0", 102, None)])
    db.close()
    with JobStore(path) as store:
        [job] = store.list_jobs()
        assert (job.id, job.state, job.exit_code, job.executor) == (
            "old-1", JobState.FAILED, 3, "local")
        assert [(t.name, t.state, t.pid) for t in job.tasks] == [
            ("chief.0", TaskState.FAILED, 101), ("ps.0", TaskState.KILLED, 102)]
        assert job.as_json()["state"] == "FAILED" and job.as_json()["step"] == 40
        assert [(p.name, p.ref) for p in store.processes("old-1")] == [
            ("chief.0", TaskRef("local", pid=100, started=11.0)),
            ("chief.0", TaskRef("local", pid=101, started=12.0)),
            ("ps.0", TaskRef("local", pid=102))]
        store.create_job(plan("new-1"), 1, 0.0)  # and it takes new jobs
        assert store.find("new-1").state is JobState.PENDING
    with JobStore(path) as store:  # opened again: nothing left to migrate
        assert [j.id for j in store.list_jobs()] == ["new-1", "old-1"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_a_job_store_from_a_newer_shoal_is_refused(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(WorkspaceError, match="written by a newer shoal"):
        JobStore(tmp_path / "jobs.db").open()


def test_task_refs_round_trip_through_json():
    ref = TaskRef("slurm", pid=None, host="n2", extra=(("job", "17"), ("step", "3")))
    assert TaskRef.from_json(ref.to_json()) == ref
    assert TaskRef("local", pid=42, started=1.5).describe() == "pid 42"
    assert TaskRef("ssh", pid=42, host="n2").describe() == "pid 42 on n2"
    with pytest.raises(LaunchError, match="damaged"):
        TaskRef.from_json("{not json")


def test_a_tasks_last_figures_are_recorded_when_the_job_ends_not_those_of_its_first_line(tmp_path):
    from shoal.launch.console import RecordsObserver
    from shoal.launch.progress_line import parse_progress

    with JobStore(tmp_path / "jobs.db") as store:
        the_plan = plan("m-1")
        store.create_job(the_plan, 1, 0.0)
        records = RecordsObserver(the_plan, store, notify=lambda text: None)
        for n in range(1, 6):  # within a second: only the first is written at once
            line = f"worker:0 step={n * 100} loss=0.3 examples/s=9 step_ms=0.{n} p95_ms=0.9 applied={n * 100}/{n * 100}"
            records.task_progress("worker.0", parse_progress(line.encode()))
        records.task_progress("worker.0", parse_progress(b"worker:0 step=501 loss=0.3 final"))  # no figures
        assert store.find("m-1").task("worker.0").applied == 100
        records.job_changed(JobState.SUCCEEDED, "done")
        task = store.find("m-1").task("worker.0")
        assert (task.applied, task.pushed, task.step_ms) == (500, 500, 0.5)
