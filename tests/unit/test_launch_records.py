"""JobStore: jobs newest first, lookup by id, prefix or name; states and processes."""

import os
import stat
from pathlib import Path

import pytest

from shoal.launch.errors import JobNotFound
from shoal.launch.executor import TaskRef
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import make_plan
from shoal.launch.records import JobStore
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
