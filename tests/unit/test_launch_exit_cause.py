"""What ended a task from outside (executor.ExitExplaining): the supervisor asks a handle that can
tell only for a task it was not stopping itself, puts the answer in the failure, and reports the
exit without it when the handle fails to tell; the Slurm executor asks Slurm once for the tasks a
cancelled job ends together. Fake handles and stand-in Slurm commands: no processes."""

import signal
import threading
import time

import pytest

from shoal.launch.executor_slurm import SlurmExecutor
from shoal.launch.slurm import JobDetail, SlurmJob
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.states import JobState
from tests.unit.test_launch_supervisor import FakeExecutor, FakeHandle, supervise

pytestmark = pytest.mark.timeout(30)
CANCELLED = "Slurm job 7 is CANCELLED (...), so nothing can run in it any more"


class ExplainingHandle(FakeHandle):
    """A fake task whose exits its executor can explain (`answer`: the cause, or an exception)."""

    answer: object = CANCELLED
    asked: list = []

    def exit_cause(self, code: int) -> str:
        self.asked.append((self.name, code))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def explaining(monkeypatch, answer=CANCELLED) -> list:
    """Make the fake executor's handles ExplainingHandles answering `answer`; the list of what
    they were asked."""
    asked: list = []
    monkeypatch.setattr(ExplainingHandle, "answer", answer)
    monkeypatch.setattr(ExplainingHandle, "asked", asked)
    monkeypatch.setattr("tests.unit.test_launch_supervisor.FakeHandle", ExplainingHandle)
    return asked


def test_a_task_killed_from_outside_fails_with_the_cause_its_executor_gives(tmp_path, monkeypatch):
    asked = explaining(monkeypatch)
    supervisor, executor, _, _ = supervise(tmp_path, {"chief": {}, "worker": {"count": 2}}, {"chief.0": [-15]})
    result = supervisor.run()
    assert result.state is JobState.FAILED
    assert f"t.chief.0 failed (killed by SIGTERM; {CANCELLED})" in result.detail, result.detail
    assert asked == [("chief.0", -15)]  # not the workers, which the chief's failure stopped
    assert executor.handle("worker.0").signals == [signal.SIGTERM]


def test_an_exit_0_is_not_explained(tmp_path, monkeypatch):
    asked = explaining(monkeypatch)
    supervisor, _, _, _ = supervise(tmp_path, {"worker": {"count": 2}}, {"worker.0": [0], "worker.1": [0]})
    assert supervisor.run().state is JobState.SUCCEEDED
    assert asked == []


def test_a_handle_that_fails_to_explain_still_reports_the_exit(tmp_path, monkeypatch):
    asked = explaining(monkeypatch, UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    supervisor, _, _, _ = supervise(tmp_path, {"chief": {}, "worker": {}}, {"chief.0": [-9]})
    result = supervisor.run()  # the test's timeout: it used to wait for that exit forever
    assert result.state is JobState.FAILED and "t.chief.0 failed (killed by SIGKILL)" in result.detail
    assert asked == [("chief.0", -9)]


class CountingSlurm(SlurmCommands):
    """squeue's state of the job (`states`, in turn, the last one repeating), slowly; `asked`
    lists each query (shared with the copies `with_timeout` makes)."""

    def __init__(self, states):
        super().__init__({})
        self.states, self.asked = list(states), []

    def state(self, job_id):
        self.asked.append(job_id)
        time.sleep(0.05)
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def detail(self, job_id):
        return JobDetail("CANCELLED", ())


def slurm_executor(commands: SlurmCommands) -> SlurmExecutor:
    executor = SlurmExecutor(commands=commands, python="python3", base_env={})
    executor._job = SlurmJob("7", ())  # as allocate() leaves it
    return executor


def test_the_tasks_a_cancelled_slurm_job_ends_together_ask_slurm_once(tmp_path):
    commands = CountingSlurm([None])  # over
    executor = slurm_executor(commands)
    said = []
    threads = [threading.Thread(target=lambda: said.append(executor._exit_cause(-15))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert commands.asked == ["7"]
    assert said == [said[0]] * 8 and said[0].startswith("Slurm job 7 is CANCELLED (scancel, its time limit"), said
    assert executor._exit_cause(1) == ""  # a task's own exit code: nothing to ask


def test_a_slurm_job_found_running_is_asked_again_for_a_later_exit(tmp_path):
    commands = CountingSlurm(["RUNNING", None])  # one task killed (the OOM killer, say), then the job cancelled
    executor = slurm_executor(commands)
    assert executor._exit_cause(-9) == ""
    time.sleep(0.6)
    assert executor._exit_cause(-15).startswith("Slurm job 7 is CANCELLED")
    assert commands.asked == ["7", "7"]
