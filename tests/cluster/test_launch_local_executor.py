"""The local executor with real processes: a task's lines, its exit code, its process
group; control through a TaskRef from another executor instance; `close` leaves nothing.
Every wait is bounded; whatever a test starts is killed by its group."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import make_plan
from shoal.launch.processes import group_members
from shoal.launch.spec import spec_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, alive, program, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def one_task(tmp_path, run):
    executor = LocalExecutor(python=PY, base_env=dict(os.environ))
    spec = spec_from_dict({"name": "x", "run": run, "roles": {"worker": {}}, "grace_period": 1})
    plan = make_plan(spec, executor.allocate(spec), job_id="x-1", shoal_home=tmp_path,
                     workdir=tmp_path)
    return executor, plan, plan.tasks[0]


def grandchild_pid(output) -> int:
    """The pid serve.py --fork prints, read from its output chunks."""
    text = b""
    for chunk in output:  # ends when the task's output does; serve.py runs 60 s
        text += chunk
        for line in text.split(b"\n")[:-1]:
            if line.startswith(b"grandchild pid "):
                return int(line.split()[-1])
    raise AssertionError(f"no grandchild pid in {text!r}")


def test_a_task_streams_its_output_as_it_comes_and_reports_its_exit_code(tmp_path):
    go = tmp_path / "go"
    code = ("import os, sys, time; sys.stdout.write('a\\nb\\r'); sys.stdout.flush()\n"
            f"for _ in range(200):\n    if os.path.exists({str(go)!r}): break\n"
            "    time.sleep(0.05)\n"
            "sys.stderr.write('c'); sys.exit(3)")
    executor, plan, task = one_task(tmp_path, ["python", "-c", code])
    try:
        handle = executor.start(plan, task)
        output, seen = handle.output(), b""
        while seen != b"a\nb\r":  # nothing is held back waiting for a newline
            seen += next(output)
            assert b"c" not in seen
        go.touch()
        assert b"".join(output) == b"c"
        assert handle.wait(10) == 3 and handle.wait() == 3
        assert handle.ref.executor == "local" and handle.ref.describe() == f"pid {handle.ref.pid}"
        assert not executor.alive(handle.ref)
    finally:
        executor.close()


def test_wait_times_out_while_the_task_runs_and_kill_by_ref_stops_it(tmp_path):
    executor, plan, task = one_task(tmp_path, ["python", program("serve.py"), "--fork"])
    try:
        handle = executor.start(plan, task)
        grandchild = grandchild_pid(handle.output())
        assert handle.wait(0.2) is None
        other = LocalExecutor()  # as `shoal kill` in another process builds it
        assert other.alive(handle.ref)
        other.kill(handle.ref)
        assert handle.wait(10) == -signal.SIGKILL
        wait_for(lambda: not alive([grandchild]), 10, "the grandchild to die with its group")
        assert not other.alive(handle.ref)
        other.kill(handle.ref)  # idempotent
    finally:
        executor.close()


def test_close_stops_running_tasks_and_their_groups(tmp_path):
    executor, plan, task = one_task(tmp_path, ["python", program("serve.py"), "--fork"])
    handle = executor.start(plan, task)
    pids = [handle.ref.pid, grandchild_pid(handle.output())]
    try:
        executor.close()
        executor.close()
        wait_for(lambda: not alive(pids), 10, "the task and its grandchild to die")
        assert handle.wait(1) == -signal.SIGKILL
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)


def test_group_members_lists_live_processes_of_a_group_but_not_zombies(tmp_path):
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        members = wait_for(lambda: (m := group_members(leader.pid)) and len(m) == 3 and m, 10,
                           "sh and its two sleeps")
        assert leader.pid in members
        assert sorted(group_members(leader.pid, exclude=leader.pid)) == sorted(
            p.pid for p in psutil.Process(leader.pid).children())
        sleeper = psutil.Process(leader.pid).children()[0]
        os.kill(leader.pid, signal.SIGSTOP)  # so it cannot reap the sleeper: a zombie
        sleeper.kill()
        wait_for(lambda: sleeper.status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
        assert sleeper.pid not in group_members(leader.pid)
        assert group_members(os.getpgid(0) + 10**7) == []
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(10)


def test_status_of_a_job_whose_launcher_died_kills_a_surviving_task(tmp_path):
    import io

    from shoal.cli.environment import Environment
    from shoal.cli.main import main
    from shoal.launch.executor import TaskRef
    from shoal.launch.records import JobStore
    from shoal.launch.states import JobState, TaskState

    survivor = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        executor, plan, task = one_task(tmp_path / "home", "true")
        with JobStore(tmp_path / "home" / "jobs.db") as store:
            store.create_job(plan, os.getpid(), 1.0)  # a launcher that no longer runs
            ref = TaskRef("local", pid=survivor.pid,
                          started=psutil.Process(survivor.pid).create_time())
            store.add_process(plan.job_id, task.name, ref)
            store.set_task(plan.job_id, task.name, TaskState.RUNNING, "", 0, ref)
            store.set_job_state(plan.job_id, JobState.RUNNING)
        env = Environment(environ={"SHOAL_HOME": str(tmp_path / "home")}, stdout=io.StringIO(),
                          stderr=io.StringIO(), stdout_bytes=io.BytesIO(), cwd=tmp_path)
        assert main(["status", "x"], env) == 0
        assert "job x-1  KILLED (the launcher died; its tasks were stopped (by its watchdog)" in env.stdout.getvalue()
        assert survivor.wait(10) == -signal.SIGKILL
    finally:
        if survivor.poll() is None:
            os.killpg(survivor.pid, signal.SIGKILL)
            survivor.wait(10)


def test_status_of_a_queued_job_whose_launcher_died_says_no_task_had_started(tmp_path):
    import io

    from shoal.cli.environment import Environment
    from shoal.cli.main import main
    from shoal.launch.records import JobStore

    with JobStore(tmp_path / "home" / "jobs.db") as store:  # as a launcher waiting in a queue records it
        store.create_queued("q-1", "q", str(tmp_path / "home" / "jobs" / "q-1"), os.getpid(), 1.0, "local",
                            "waits in the queue")  # a launcher that no longer runs (another start time)
    env = Environment(environ={"SHOAL_HOME": str(tmp_path / "home")}, stdout=io.StringIO(),
                      stderr=io.StringIO(), stdout_bytes=io.BytesIO(), cwd=tmp_path)
    assert main(["status", "q"], env) == 0
    assert "job q-1  KILLED (the launcher died before any task started)" in env.stdout.getvalue(), \
        env.stdout.getvalue()
