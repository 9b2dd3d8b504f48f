"""Job references: a job's number, id, id prefix or name (its newest job), a task of it
(`12.worker.1`), and the newest job when none is given."""

import sqlite3
from pathlib import Path

import pytest

from shoal.launch.errors import JobNotFound
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.job_refs import find_job, find_task
from shoal.launch.plan import make_plan
from shoal.launch.records import JobStore
from shoal.launch.records_schema import SCHEMA_VERSION
from shoal.launch.spec import spec_from_dict


def plan(job_id, name="job"):
    spec = spec_from_dict({"name": name, "run": "true", "roles": {"worker": {"count": 2}}})
    return make_plan(spec, LocalExecutor(python="/py").allocate(spec), job_id=job_id,
                     shoal_home=Path("/h"), workdir=Path("/w"))


def test_job_name_means_its_newest_job_after_two_runs(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("job-20260101-100000-aaaa"), 1, 0.0)
        store.create_job(plan("job-20260101-100001-bbbb"), 1, 0.0)
        assert store.find("job").id == "job-20260101-100001-bbbb"


def test_id_prefix_still_finds_one_job_and_an_ambiguous_one_names_the_ids(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("job-20260101-100000-aaaa"), 1, 0.0)
        store.create_job(plan("job-20260101-100001-bbbb"), 1, 0.0)
        assert store.find("job-20260101-100000").id == "job-20260101-100000-aaaa"
        with pytest.raises(JobNotFound) as error:
            store.find("job-2026")
        assert "job-20260101-100000-aaaa" in str(error.value)
        assert "job-20260101-100001-bbbb" in str(error.value)


def test_jobs_are_numbered_in_order_and_found_by_number(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        assert store.create_job(plan("a-1", "a"), 1, 0.0) == 1
        assert store.create_job(plan("b-1", "b"), 1, 0.0) == 2
        assert [j.number for j in store.list_jobs()] == [2, 1]
        assert store.find("1").id == "a-1" and store.find("2").id == "b-1"
        assert store.find("a-1").as_json()["number"] == 1
        with pytest.raises(JobNotFound, match="no job '3'"):
            store.find("3")


def test_a_deleted_jobs_number_is_never_given_again(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("a-1", "a"), 1, 0.0)
        store.create_job(plan("a-2", "a"), 1, 0.0)
        store.delete_job("a-2")
        assert store.create_job(plan("a-3", "a"), 1, 0.0) == 3
        with pytest.raises(JobNotFound):
            store.find("2")


def test_task_reference_names_a_job_by_number_and_one_of_its_tasks(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("job-1"), 1, 0.0)
        store.create_job(plan("job-2"), 1, 0.0)
        job, task = find_task(store, "1.worker.1")
        assert (job.id, task) == ("job-1", "worker.1")
        job, task = find_task(store, "job.worker.0")
        assert (job.id, task) == ("job-2", "worker.0")
        assert find_task(store, "job-1") == (store.find("job-1"), None)
        with pytest.raises(JobNotFound, match="no task 'worker.7'"):
            find_task(store, "1.worker.7")


def test_a_task_reference_with_a_misspelt_role_names_the_role_and_the_one_meant(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        store.create_job(plan("job-1"), 1, 0.0)
        with pytest.raises(JobNotFound) as error:
            find_task(store, "1.wrker.1")
        assert str(error.value).startswith("'1.wrker.1': 'wrker' is not a role (did you mean worker?); a task is"
                                           " JOB.ROLE.INDEX, e.g. 1.worker.1; roles are ")
        with pytest.raises(JobNotFound, match="no job '9.wrker.1'"):  # no job 9 either: the job is what is wrong
            find_task(store, "9.wrker.1")


def test_no_job_given_means_the_newest_job(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        with pytest.raises(JobNotFound, match="no jobs yet"):
            find_job(store, None)
        store.create_job(plan("a-1", "a"), 1, 0.0)
        store.create_job(plan("b-1", "b"), 1, 0.0)
        assert find_job(store, None).id == "b-1"
        assert find_job(store, "a").id == "a-1"


V1_JOB = ("INSERT INTO jobs (id, name, state, created, job_dir, model_dir) VALUES"
          " (?, 'old', 'SUCCEEDED', ?, '/h/jobs/x', '/h/jobs/x/model')")


V1_SCHEMA = """
CREATE TABLE jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
  ended REAL, exit_code INTEGER, reason TEXT NOT NULL DEFAULT '',
  launcher_pid INTEGER, launcher_started REAL, job_dir TEXT NOT NULL,
  model_dir TEXT NOT NULL, step INTEGER, loss REAL, executor TEXT NOT NULL DEFAULT 'local'
);
CREATE TABLE tasks (
  job_id TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, address TEXT NOT NULL,
  state TEXT NOT NULL, pid INTEGER, restarts INTEGER NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT '', log_path TEXT NOT NULL, position INTEGER NOT NULL,
  PRIMARY KEY (job_id, name)
);
CREATE TABLE processes (
  job_id TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER, started REAL, ref TEXT NOT NULL
);
"""


def test_a_version_1_job_store_gets_numbers_in_creation_order(tmp_path):
    path = tmp_path / "jobs.db"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.executemany(V1_JOB, [("old-b", 20.0), ("old-a", 10.0), ("old-c", 30.0)])
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with JobStore(path) as store:
        assert [(j.id, j.number) for j in store.list_jobs()] == [
            ("old-c", 3), ("old-b", 2), ("old-a", 1)]
        assert store.find("1").id == "old-a"
        assert store.create_job(plan("new-1"), 1, 0.0) == 4
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
