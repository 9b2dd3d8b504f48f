"""What a failed job says about its failure, with the supervisor's fake executor and clock:
the first task that failed for good is the root cause (with its code, time and last lines),
and a task that exits 2 (a usage error) within its first second is not restarted."""


import pytest

from shoal.launch.root_cause import TAIL_LINES, load_root_cause, report_root_cause, tail_of
from shoal.launch.states import JobState, TaskState
from shoal.launch.supervisor import EndReason
from tests.unit.test_launch_supervisor import RUN, supervise

pytestmark = pytest.mark.timeout(30)
ON_FAILURE = {"policy": "on-failure", "max_restarts": 3, "backoff": "1s"}


def test_first_task_that_failed_for_good_is_the_root_cause(tmp_path):
    supervisor, _, _, _ = supervise(tmp_path, {"worker": {"count": 2}, "ps": {}}, {"worker.1": [1]})
    result = supervisor.run()
    failure = result.failure
    assert (failure.task, failure.label, failure.exit_code, failure.detail) == ("worker.1", "t.worker.1", 1, "exit 1")
    assert failure.log_path.endswith("/logs/worker.1.log")


def test_root_cause_block_ends_the_output_and_is_kept_for_status(tmp_path):
    supervisor, _, _, _ = supervise(tmp_path, {"worker": {"count": 2}, "ps": {}}, {"worker.1": [-9]})
    result = supervisor.run()
    notes: list[str] = []
    report_root_cause(result.failure, tmp_path, notes.append)
    assert notes[1] == "shoal | Root cause (first observed failure):"
    assert "shoal |   task:      t.worker.1" in notes
    assert "shoal |   exit:      killed by SIGKILL" in notes
    assert "shoal |     worker.1 says hello" in notes  # the last lines of its output
    kept = load_root_cause(tmp_path)
    assert kept is not None and kept.failure == result.failure
    assert kept.last_lines == ("worker.1 says hello",)


def test_a_job_stopped_by_request_has_no_root_cause(tmp_path):
    supervisor, _, recorder, _ = supervise(tmp_path, {"worker": {}}, {})
    recorder.hooks[("worker.0", TaskState.RUNNING)] = lambda: supervisor.request_stop("test")
    result = supervisor.run()
    assert result.reason is EndReason.STOPPED and result.failure is None


def test_start_failure_is_the_root_cause_without_output(tmp_path):
    supervisor, _, _, _ = supervise(tmp_path, {"worker": {}, "ps": {}}, {}, fail_start=frozenset({"worker.0"}))
    failure = supervisor.run().failure
    assert failure.task == "worker.0" and failure.exit_code is None and "cannot run 'nope'" in failure.detail
    notes: list[str] = []
    report_root_cause(failure, tmp_path, notes.append)
    assert not any("last lines" in n for n in notes)


def test_exit_2_within_the_first_second_is_not_restarted(tmp_path):
    supervisor, executor, recorder, _ = supervise(tmp_path, {"worker": {}}, {"worker.0": [2, 0]}, restart=ON_FAILURE)
    result = supervisor.run()
    assert (result.state, result.failure.exit_code) == (JobState.FAILED, 2)
    assert len(executor.starts) == 1
    assert TaskState.RESTARTING not in recorder.final().values()
    [detail] = [d for _, _, _, new, d in recorder.tasks if new is TaskState.FAILED]
    assert detail == "exit 2 within 1s of its start, a usage error: not restarted"


def test_exit_2_after_the_first_second_is_restarted(tmp_path):
    supervisor, executor, recorder, _ = supervise(tmp_path, {"worker": {}}, {"worker.0": [RUN, 0]}, tick=0.5,
                                                  restart=ON_FAILURE)
    clock = executor._clock

    def exit_2_later():
        recorder.hooks.pop(("worker.0", TaskState.RUNNING))
        clock.now += 5  # it ran for 5 s
        executor.handle("worker.0").exit(2)

    recorder.hooks[("worker.0", TaskState.RUNNING)] = exit_2_later
    result = supervisor.run()
    assert result.state is JobState.SUCCEEDED
    assert len(executor.starts) == 2


def test_other_quick_failures_are_still_restarted(tmp_path):
    supervisor, executor, _, _ = supervise(tmp_path, {"worker": {}}, {"worker.0": [1, 0]}, tick=0.5,
                                           restart=ON_FAILURE)
    assert supervisor.run().state is JobState.SUCCEEDED
    assert len(executor.starts) == 2


def test_tail_of_a_log_is_its_last_traceback_whole(tmp_path):
    log = tmp_path / "worker.0.log"
    lines = [f"step={i} loss=1.0" for i in range(100)] + [
        "Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "ValueError: bad batch", ""]
    log.write_text("\n".join(lines))
    assert tail_of(log) == lines[100:103]


def test_tail_of_a_log_without_a_traceback_is_its_last_lines(tmp_path):
    log = tmp_path / "worker.0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail_of(log) == [f"line {i}" for i in range(100 - TAIL_LINES, 100)]
    assert tail_of(tmp_path / "missing.log") == []
