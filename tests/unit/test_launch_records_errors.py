"""The job records when their file is full, damaged or hand-edited: a WorkspaceError that
names the file (or the job) and the fix, never an sqlite3 traceback; and the launcher's
writes (RecordsWriter) say a failure once and let the job go on."""

from __future__ import annotations

import sqlite3

import pytest

from shoal.launch.errors import LaunchError, WorkspaceError
from shoal.launch.executor import TaskRef
from shoal.launch.records import JobStore
from shoal.launch.records_writer import RecordsWriter
from shoal.launch.states import TaskState
from tests.unit.test_launch_records import plan


def recorded(tmp_path, jobs=("m-1", "m-2", "m-3")):
    path = tmp_path / "jobs.db"
    with JobStore(path) as store:
        for job in jobs:
            store.create_job(plan(job), 1, 0.0)
            store.add_process(job, "worker.0", TaskRef("local", pid=42, started=1.0))
    return path


def test_a_file_that_is_not_a_database_is_refused_naming_it_and_how_to_move_it_aside(tmp_path):
    path = tmp_path / "jobs.db"
    path.write_bytes(b"not sqlite at all " * 500)
    with pytest.raises(WorkspaceError) as caught:
        JobStore(path).open()
    assert f"cannot use the job records {path}: file is not a database" in str(caught.value)
    assert f"mv {path} {path}.damaged" in str(caught.value)


def test_a_damaged_page_is_a_clear_error_not_a_traceback(tmp_path):
    path = recorded(tmp_path)
    with sqlite3.connect(path) as db:  # the WAL folded into the file, so that the pages below hold the tables
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    data[page:] = b"\xa5" * (len(data) - page)  # every page but the header's
    path.write_bytes(bytes(data))
    with pytest.raises(WorkspaceError) as caught:
        with JobStore(path) as store:
            store.list_jobs()
    assert "the file is damaged" in str(caught.value) and f"sqlite3 {path} .recover" in str(caught.value)


def test_a_full_disk_is_a_clear_error_saying_to_free_space(tmp_path):
    path = recorded(tmp_path, jobs=("m-1",))
    with JobStore(path) as store:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own "database or disk is full"
        with pytest.raises(WorkspaceError) as caught:
            for i in range(200):
                store.set_task("m-1", "worker.0", TaskState.RUNNING, "x" * 4000 + str(i), 0)
        assert "database or disk is full" in str(caught.value)
        assert "free space on the disk that holds" in str(caught.value)
        assert store.find("m-1").id == "m-1"  # reading still works


def test_a_hand_edited_job_row_names_the_job_and_how_to_remove_it(tmp_path):
    path = recorded(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET state = 'BOGUS' WHERE id = 'm-2'")
    with JobStore(path) as store:
        assert store.find("m-3").id == "m-3"  # the others are fine
        with pytest.raises(WorkspaceError) as caught:
            store.find("m-2")
    assert f"the record of job m-2 in {path} is damaged ('BOGUS' is not a valid JobState)" in str(caught.value)
    assert "DELETE FROM jobs WHERE id = 'm-2'" in str(caught.value)


def test_a_damaged_task_reference_names_its_job(tmp_path):
    path = recorded(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE processes SET ref = '{garbage' WHERE job_id = 'm-2'")
    with JobStore(path) as store:
        with pytest.raises(LaunchError, match=r"^job m-2: a task reference in the job records is damaged"):
            store.processes("m-2")


def test_the_launchers_writes_say_a_failure_once_and_the_recovery_once():
    notes: list[str] = []
    writer = RecordsWriter(notes.append)
    failing = [True]

    def write(value):
        if failing[0]:
            raise WorkspaceError(f"cannot use the job records /h/jobs.db: database or disk is full ({value})")

    assert writer.call(write, 1) is False and writer.call(write, 2) is False
    assert notes == ["shoal | cannot use the job records /h/jobs.db: database or disk is full (1) — the job goes on;"
                     " shoal status shows it as last recorded until the records can be written again"]
    failing[0] = False
    assert writer.call(write, 3) is True and writer.call(write, 4) is True
    assert notes[1:] == ["shoal | the job records can be written again"]
