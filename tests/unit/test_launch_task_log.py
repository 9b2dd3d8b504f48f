"""TaskLog: a task's log file that, when it cannot be written, is given up with one note
instead of raising (the console and the progress parsing must go on)."""

import os

import pytest

from shoal.launch.task_log import TaskLog, TaskLogState

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"),
                                    reason="needs /dev/full (Linux), where every write fails with ENOSPC")


def test_bytes_are_appended_and_a_last_line_is_completed_on_close(tmp_path):
    path = tmp_path / "logs" / "worker.0.log"
    path.parent.mkdir()
    path.write_bytes(b"attempt 1\n")
    log = TaskLog(path, "j.worker.0", warn=lambda text: pytest.fail(text))
    log.open()
    log.write(b"a\nb")
    log.close()
    log.close()  # idempotent
    assert path.read_bytes() == b"attempt 1\na\nb\n"
    assert log.state is TaskLogState.CLOSED


@needs_dev_full
def test_write_failure_is_noted_once_and_later_writes_are_dropped_when_the_disk_is_full():
    notes = []
    log = TaskLog("/dev/full", "j.worker.0", warn=notes.append)
    log.open()
    assert log.state is TaskLogState.OPEN
    log.write(b"step=1 loss=1\n")  # raises nothing
    log.write(b"step=2 loss=1\n")
    log.close()
    assert log.state is TaskLogState.CLOSED
    assert notes == ["shoal | j.worker.0: cannot write its log /dev/full: No space left on device;"
                     " its lines still show here, and are no longer kept in the file"
                     " (free space on that disk for later logs)"]


def test_open_failure_is_noted_once_and_writes_are_dropped_when_the_folder_is_not_one(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    notes = []
    log = TaskLog(tmp_path / "file" / "worker.0.log", "j.worker.0", warn=notes.append)
    log.open()
    log.write(b"line\n")
    log.close()
    assert notes == [f"shoal | j.worker.0: cannot write its log {tmp_path}/file/worker.0.log: Not a directory;"
                     f" its lines still show here, and are no longer kept in the file (make it writable for"
                     f" later logs)"]
