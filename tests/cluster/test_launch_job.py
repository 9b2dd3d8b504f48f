"""Whole jobs under the real launcher (`python -m shoal.cli.main`), with tiny programs
from tests/launch_programs: success, teardown policy, deadline, restarts, kill, and the
launcher's own death. Every wait is bounded; every test cleans up by recorded PID."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, alive, cleanup, grandchild_pids, program, recorded_pids,  # noqa: E402
                     run_shoal, start_shoal, status, task_log, wait_for, write_spec)

pytestmark = pytest.mark.timeout(60)


def spec(tmp_path: Path, body: str, name: str = "t") -> str:
    text = f"name: {name}\n" + body.replace("PY", PY).replace("PROGRAMS/", program("") + "/")
    return str(write_spec(tmp_path / "job.yaml", text))


def test_job_succeeds_when_workers_succeed_and_ps_is_stopped(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/work.py --steps 3
roles:
  ps: {count: 2, run: PY PROGRAMS/serve.py}
  worker: {count: 2}
""")
    try:
        out = run_shoal(home, "train", path, timeout=45)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        [job] = status(home)
        assert job["state"] == "SUCCEEDED"
        states = {t["name"]: t["state"] for t in job["tasks"]}
        assert states == {"ps.0": "KILLED", "ps.1": "KILLED",
                          "worker.0": "SUCCEEDED", "worker.1": "SUCCEEDED"}
        assert job["step"] == 30
        assert "t.worker.1 | worker:1 done, exit 0" in text
        assert "t.ps.0: RUNNING -> KILLED" in text
        assert len(recorded_pids(home)) == 4
        assert alive(recorded_pids(home)) == []
        log = Path(job["job_dir"]) / "logs" / "worker.0.log"
        assert "worker:0 done" in log.read_text()
    finally:
        cleanup(home)


def test_chief_failure_stops_every_task_within_5s(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/serve.py --fork
roles:
  chief: {count: 1, run: PY PROGRAMS/work.py --exit 3 --sleep 0.5}
  worker: {count: 2}
  ps: {count: 1}
""")
    launcher = start_shoal(home, "train", path)
    try:
        out, _ = launcher.communicate(timeout=30)
        text = out.decode()
        assert launcher.returncode == 3, text
        [job] = status(home)
        assert job["state"] == "FAILED"
        assert "chief.0 failed (exit 3)" in job["reason"]
        assert job["ended"] - job["created"] < 5.0 + 2.0  # start-up + 0.5 s run + teardown
        assert alive(recorded_pids(home) + grandchild_pids(home)) == []
        assert {t["state"] for t in job["tasks"] if t["name"] != "chief.0"} == {"KILLED"}
    finally:
        cleanup(home, launcher)


def test_exit_code_is_the_chiefs_and_teardown_kills_term_ignoring_tasks(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/serve.py --ignore-term
grace_period: 0.5s
roles:
  worker: {count: 1, run: PY PROGRAMS/work.py --exit 7}
  ps: {count: 1}
""")
    try:
        out = run_shoal(home, "train", path, timeout=30)
        assert out.returncode == 7, out.stdout.decode()
        assert "t.ps.0: RUNNING -> KILLED (killed by SIGKILL)" in out.stdout.decode()
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home)


def test_restart_on_failure_restarts_with_same_identity_and_job_succeeds(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/flaky.py --fail-times 1
restart: {policy: on-failure, max_restarts: 2, backoff: 0.1s}
roles:
  worker: {count: 2}
""")
    try:
        out = run_shoal(home, "train", path, timeout=30)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        [job] = status(home)
        assert job["state"] == "SUCCEEDED"
        assert [t["restarts"] for t in job["tasks"]] == [1, 1]
        assert "RUNNING -> RESTARTING (exit 1; restart 1/2 in 0.1s)" in text
        for index in (0, 1):
            configs = [line.split("TF_CONFIG ", 1)[1] for line in text.splitlines()
                       if line.startswith(f"t.worker.{index} | attempt")]
            assert len(configs) == 2 and configs[0] == configs[1]
            log = Path(job["tasks"][index]["log_path"]).read_text().splitlines()
            marks = [i for i, line in enumerate(log) if line.endswith(f"t.worker.{index}: attempt 2 starts (restarted)")]
            assert len(marks) == 1 and log[marks[0]].startswith("shoal | "), log  # between the two attempts
            assert any(line.startswith("attempt") for line in log[:marks[0]]), log
            assert any(line.startswith("attempt") for line in log[marks[0]:]), log
    finally:
        cleanup(home)


def test_restarts_exhausted_fail_the_job(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/flaky.py --fail-times 5
restart: {policy: on-failure, max_restarts: 1, backoff: 0s}
roles:
  worker: {count: 1}
""")
    try:
        out = run_shoal(home, "train", path, timeout=30)
        assert out.returncode == 1, out.stdout.decode()
        [job] = status(home)
        assert job["state"] == "FAILED" and job["tasks"][0]["restarts"] == 1
    finally:
        cleanup(home)


def test_deadline_stops_the_job_with_exit_124(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/serve.py
deadline: 1s
roles:
  worker: {count: 1}
""")
    try:
        out = run_shoal(home, "train", path, timeout=30)
        assert out.returncode == 124, out.stdout.decode()
        [job] = status(home)
        assert job["state"] == "FAILED" and "deadline" in job["reason"]
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home)


def test_failing_evaluator_does_not_block_success(tmp_path):
    home = tmp_path / "home"
    path = spec(tmp_path, """
run: PY PROGRAMS/work.py --sleep 1
roles:
  worker: {count: 1}
  evaluator: {count: 1, run: PY PROGRAMS/work.py --exit 2 --sleep 0}
""")
    try:
        out = run_shoal(home, "train", path, timeout=30)
        assert out.returncode == 0, out.stdout.decode()
        [job] = status(home)
        assert job["state"] == "SUCCEEDED"
        assert {t["name"]: t["state"] for t in job["tasks"]}["evaluator.0"] == "FAILED"
    finally:
        cleanup(home)


def test_missing_program_fails_the_job_with_127(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--workers", "1", "--", "/no/such/program", timeout=30)
        assert out.returncode == 127, out.stdout.decode()
        assert "cannot run '/no/such/program'" in out.stdout.decode()
    finally:
        cleanup(home)


def test_shoal_kill_from_another_process_leaves_nothing_and_records_killed(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "k", "--ps", "1", "--workers", "2", "--",
                           PY, program("serve.py"), "--fork")
    try:
        wait_for(lambda: len(grandchild_pids(home)) == 3, 20, "3 tasks with grandchildren")
        out = run_shoal(home, "kill", "k", timeout=30)
        assert out.returncode == 0, out.stdout.decode()
        assert launcher.wait(10) == 130
        [job] = status(home)
        assert job["state"] == "KILLED" and job["reason"] == "stopped by shoal kill", job
        assert "job k: KILLED (stopped by shoal kill)" in out.stdout.decode().replace(job["id"], "k")
        assert {t["state"] for t in job["tasks"]} == {"KILLED"}
        assert alive(recorded_pids(home) + grandchild_pids(home)) == []
        again = run_shoal(home, "kill", "k", timeout=30)
        assert again.returncode == 0 and "KILLED" in again.stdout.decode()
    finally:
        cleanup(home, launcher)


def test_launcher_sigkill_leaves_nothing_after_5s(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "orphan", "--ps", "1", "--workers", "2",
                           "--", PY, program("serve.py"), "--fork")
    try:
        wait_for(lambda: len(grandchild_pids(home)) == 3, 20, "3 tasks with grandchildren")
        pids = recorded_pids(home) + grandchild_pids(home)
        assert len(alive(pids)) == 6
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(5)
        killed_at = time.monotonic()
        wait_for(lambda: not alive(pids), 5, "every task and grandchild to die")
        assert time.monotonic() - killed_at < 5
        [job] = status(home)
        assert job["state"] == "KILLED"  # reconciled: the launcher is gone
    finally:
        cleanup(home, launcher)


def test_one_sigint_delivered_twice_still_waits_out_the_grace_period(tmp_path):
    """`timeout ... shoal train` forwards the SIGINT its group got: shoal gets it twice, at once."""
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "twice", "--workers", "1", "--grace", "3s", "--",
                           PY, program("serve.py"), "--ignore-term")
    try:  # RUNNING and serving (its SIGTERM ignored): a task still starting is not given a grace
        wait_for(lambda: "serving worker:0" in task_log(home, "worker.0") and (jobs := status(home))
                 and jobs[0]["tasks"][0]["state"] == "RUNNING", 20, "the task to serve")
        launcher.send_signal(signal.SIGINT)
        launcher.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        assert launcher.wait(20) == 130
        assert time.monotonic() - stopped_at >= 2.5  # the 3 s grace, not an immediate SIGKILL
        text = launcher.stdout.read().decode()
        assert "asked to stop again" not in text, text
        [job] = status(home)
        assert job["state"] == "KILLED" and job["reason"] == "the launcher got SIGINT", job
    finally:
        cleanup(home, launcher)


def test_sigint_to_launcher_stops_the_job_as_killed(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "i", "--workers", "1", "--",
                           PY, program("serve.py"))
    try:
        wait_for(lambda: recorded_pids(home), 20, "the task to start")
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(15) == 130
        [job] = status(home)
        assert job["state"] == "KILLED" and job["reason"] == "the launcher got SIGINT", job
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home, launcher)
