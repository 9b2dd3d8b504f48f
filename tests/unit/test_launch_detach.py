"""The pieces of unattended runs without a launcher: the background launcher's command line,
reading a job's output back from its files, the exit code `attach` ends with, and the
detach-or-stop question read from a pipe."""

import io
import os
import threading

import pytest

from shoal.cli.exit_codes import recorded_exit_code
from shoal.cli.interrupt import Choice, ask_detach_or_stop
from shoal.launch.detach import BACKGROUND_FLAG, background_argv
from shoal.launch.follow import JobOutput
from shoal.launch.records import JobRecord, TaskRecord
from shoal.launch.states import JobState, TaskState


def test_background_argv_names_the_job_right_after_the_command_and_leaves_the_program_alone():
    argv = ["run", "--workers", "2", "--detach", "--", "python", "t.py", "--detach", "run"]
    assert background_argv(argv, "run", "j-1") == [
        "run", BACKGROUND_FLAG, "j-1", "--workers", "2", "--detach", "--", "python", "t.py", "--detach", "run"]


def job(tmp_path, state=JobState.RUNNING, exit_code=None) -> JobRecord:
    tasks = tuple(TaskRecord(f"worker.{i}", f"j.worker.{i}", "127.0.0.1:1", TaskState.RUNNING, None, 0, "",
                             str(tmp_path / "logs" / f"worker.{i}.log")) for i in range(2))
    return JobRecord("j-1", "j", state, 0.0, None, exit_code, "", None, None, str(tmp_path), str(tmp_path),
                     None, None, "local", 1, tasks)


def test_job_output_prefixes_whole_task_lines_and_keeps_a_partial_one_for_later(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.0.log").write_bytes(b"one\ntw")
    output = JobOutput(job(tmp_path))
    assert output.read() == b"j.worker.0 | one\n"
    with open(tmp_path / "logs" / "worker.0.log", "ab") as f:
        f.write(b"o\nthree")
    (tmp_path / "logs" / "worker.1.log").write_bytes(b"hello\n")
    assert output.read() == b"j.worker.0 | two\nj.worker.1 | hello\n"
    assert output.read(final=True) == b"j.worker.0 | three\n"
    assert output.read(final=True) == b""


def test_job_output_reads_a_truncated_log_again_from_its_start_after_a_note(tmp_path):
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "worker.0.log"
    log.write_bytes(b"one\ntwo\n")
    output = JobOutput(job(tmp_path))
    assert output.read() == b"j.worker.0 | one\nj.worker.0 | two\n"
    log.write_bytes(b"three\n")  # truncated (logrotate's copytruncate), then written again
    assert output.read() == (f"shoal | ({log} was truncated; following it from its start)\n".encode()
                             + b"j.worker.0 | three\n")
    assert output.read() == b""


def test_job_output_reads_the_launchers_console_when_the_job_has_one(tmp_path):
    (tmp_path / "launcher.log").write_bytes(b"shoal | job j-1: RUNNING\nj.worker.0 | one\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.0.log").write_bytes(b"one\n")
    output = JobOutput(job(tmp_path))
    assert output.files == [tmp_path / "launcher.log"]
    assert output.read() == b"shoal | job j-1: RUNNING\nj.worker.0 | one\n"


@pytest.mark.parametrize("state, exit_code, want", [
    (JobState.FAILED, 3, 3), (JobState.SUCCEEDED, None, 0), (JobState.KILLED, None, 130),
    (JobState.FAILED, None, 1)])
def test_attach_exits_with_the_recorded_code_else_one_for_the_state(tmp_path, state, exit_code, want):
    assert recorded_exit_code(job(tmp_path, state, exit_code)) == want


def ask_with(keys: bytes, close: bool, timeout_s: float = 5.0) -> tuple[Choice, str]:
    read, write = os.pipe()
    os.write(write, keys)
    if close:
        os.close(write)
    err = io.StringIO()
    with os.fdopen(read) as stdin:
        try:
            return ask_detach_or_stop(stdin, err, timeout_s=timeout_s), err.getvalue()
        finally:
            if not close:
                os.close(write)


def test_question_detaches_on_d_and_ignores_other_keys_before_it():
    choice, said = ask_with(b"xd", close=False)
    assert choice is Choice.DETACH
    assert "[d]etach (the job keeps running) or [s]top it? (stops in 5 s) detach" in said


@pytest.mark.parametrize("keys, close", [(b"s", False), (b"\n", False), (b"", True)],
                         ids=["s", "enter", "end-of-input"])
def test_question_stops_on_s_enter_or_end_of_input(keys, close):
    assert ask_with(keys, close)[0] is Choice.STOP


def test_unanswered_question_stops_when_the_time_is_up():
    done = threading.Event()
    result = []

    def ask():
        result.append(ask_with(b"", close=False, timeout_s=0.2)[0])
        done.set()

    threading.Thread(target=ask, daemon=True).start()
    assert done.wait(10)
    assert result == [Choice.STOP]


def test_background_flag_takes_only_an_id_for_the_jobs_name(tmp_path):
    from tests.unit.test_launch_cli import Captured

    shoal = Captured(tmp_path)
    code = shoal("run", "--name", "j", BACKGROUND_FLAG, "../../elsewhere", "--", "python", "t.py")
    assert code == 3
    assert "'../../elsewhere' is not an id for a job named 'j'" in shoal.err.getvalue()
    assert not (tmp_path / "home" / "jobs").exists()


def test_dry_run_with_detach_prints_the_plan_and_starts_nothing(tmp_path):
    from tests.unit.test_launch_cli import Captured

    shoal = Captured(tmp_path)
    assert shoal("run", "--name", "j", "--detach", "--dry-run", "--", "python", "t.py") == 0
    assert "t.py" in shoal.out.getvalue() and not (tmp_path / "home" / "jobs").exists()
