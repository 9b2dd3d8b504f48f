"""Job records that were emptied (`: > jobs.db`, a restore gone wrong) while job folders from
before stay beside them: the first command that opens them says so, once."""

from shoal.launch.records import JobStore


def _open(path):
    said = []
    store = JobStore(path, note=said.append).open()
    store.close()
    return said


def test_emptied_records_beside_job_folders_are_named_once(tmp_path):
    for name in ("mnist-20261127-101010-ab12", "mnist-20261127-111111-cd34"):
        (tmp_path / "jobs" / name / "logs").mkdir(parents=True)
    (tmp_path / "jobs" / "mnist-20261127-121212-ef56").mkdir()  # a job starting now: no logs folder yet
    (tmp_path / "jobs.db").write_bytes(b"")
    [note] = _open(tmp_path / "jobs.db")
    assert note.startswith(f"shoal: the job records {tmp_path / 'jobs.db'} are new, but {tmp_path / 'jobs'} holds 2 "
                           "job folder(s) from before (mnist-20261127-101010-ab12, mnist-20261127-111111-cd34): ")
    assert "job numbers start again at 1" in note
    assert _open(tmp_path / "jobs.db") == []  # said once: the records exist now


def test_new_records_in_a_new_home_say_nothing(tmp_path):
    assert _open(tmp_path / "home" / "jobs.db") == []
    (tmp_path / "other" / "jobs" / "t-20261127-121212-ef56").mkdir(parents=True)  # --detach's folder comes first
    assert _open(tmp_path / "other" / "jobs.db") == []
