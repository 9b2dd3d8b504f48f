"""`shoal scale` on real jobs (issue 13, item 4): a detached local job grows from 2 to 4
workers and shrinks back while it runs, its added tasks recorded and reachable by `status`
and `logs`, its ps's membership shown by `status`; then the seed MNIST example, the same
way. Every wait is bounded; what the tests start is killed by recorded pid or group."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, cleanup_launchers, only_job, program, run_ok, run_shoal, task_log,  # noqa: E402
                     wait_for, wait_nothing_left)


def _states(home: Path) -> dict:
    return {t["name"]: t["state"] for t in only_job(home)["tasks"]}


def _log_has_steps(home: Path, name: str) -> bool:
    return "step=" in task_log(home, name)


@pytest.mark.timeout(120)
def test_a_detached_job_scales_up_and_down_and_ends_succeeded(tmp_path):
    home = tmp_path / "home"
    try:
        run_ok(home, "run", "--name", "sc", "--ps", "1", "--workers", "2..4", "--detach", "--", PY,
               program("scalable.py"))
        wait_for(lambda: _log_has_steps(home, "worker.1"), 30, "worker.1 to train")

        text = run_ok(home, "scale", "sc", "worker=4")
        assert "worker=4 (was 2): started worker:2, worker:3" in text
        wait_for(lambda: _log_has_steps(home, "worker.2") and _log_has_steps(home, "worker.3"), 30,
                 "the added workers to print progress")
        logs = run_shoal(home, "logs", "sc.worker.3", timeout=30)
        assert logs.returncode == 0 and "worker:3 step=" in logs.stdout.decode()
        tf_config = json.loads(_env_of(home, "worker.3")["TF_CONFIG"])
        assert tf_config["task"] == {"type": "worker", "index": 3}
        assert len(tf_config["cluster"]["worker"]) == 4 and len(tf_config["cluster"]["ps"]) == 1

        text = run_ok(home, "scale", "sc", "worker=2")
        assert "worker=2 (was 4): stopped worker:3, worker:2" in text
        states = _states(home)
        assert states["worker.2"] == states["worker.3"] == "SCALED_DOWN"
        assert states["worker.0"] == states["worker.1"] == "RUNNING"

        refused = run_shoal(home, "scale", "sc", "worker=5", timeout=60)
        assert refused.returncode != 0 and "outside this job's range 2..4" in refused.stdout.decode()

        shown = run_shoal(home, "status", "sc", timeout=30).stdout.decode()
        assert "membership v3 (ps:0): 2 training [worker:0, worker:1]" in shown
        assert only_job(home)["membership_version"] == 3

        (Path(only_job(home)["model_dir"]) / "finish").touch()
        wait_for(lambda: only_job(home)["state"] != "RUNNING", 30, "the job to end")
        assert only_job(home)["state"] == "SUCCEEDED"
        wait_nothing_left(home)
    finally:
        cleanup_launchers(home)


def _env_of(home: Path, name: str) -> dict:
    """The environment of the recorded task `name` while it runs (psutil reads /proc)."""
    import psutil

    pid = next(t["pid"] for t in only_job(home)["tasks"] if t["name"] == name)
    return psutil.Process(pid).environ()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, steps", [([], 60000), (["--sync"], 15000)], ids=["async", "sync"])
def test_mnist_grows_from_two_to_four_workers_and_back_and_succeeds(tmp_path, mode, steps):
    """The seed example, asynchronous and synchronous: the added workers' gradients are applied
    (the ps counts them when they leave), and nothing hangs when they go. Needs the ps's
    membership (issue 13, item 1): without it the ps ends when as many workers as its TF_CONFIG
    lists have said done, and a sync step waits for a worker that was stopped."""
    home = tmp_path / "home"
    try:
        run_ok(home, "run", "--name", "mn", "--ps", "1", "--workers", "2..4", "--detach", "--", "python",
               "examples/mnist_softmax.py", "--steps", str(steps), "--ps_recovery_timeout", "30", *mode)
        wait_for(lambda: _log_has_steps(home, "worker.1"), 60, "worker.1 to train")
        assert "worker=4 (was 2): started worker:2, worker:3" in run_ok(home, "scale", "mn", "worker=4")
        wait_for(lambda: _log_has_steps(home, "worker.2") and _log_has_steps(home, "worker.3"), 60,
                 "the added workers to print progress")
        assert "worker=2 (was 4): stopped worker:3, worker:2" in run_ok(home, "scale", "mn", "worker=2")
        wait_for(lambda: only_job(home)["state"] != "RUNNING", 200, "the job to end")
        job = only_job(home)
        assert job["state"] == "SUCCEEDED", json.dumps(job, indent=1)
        states = {t["name"]: t["state"] for t in job["tasks"]}
        assert states["worker.2"] == states["worker.3"] == "SCALED_DOWN"
        ps_log = task_log(home, "ps.0")
        for added in ("worker:2", "worker:3"):
            assert f"{added} joined" in ps_log, ps_log[-3000:]
            applied = re.search(rf"{added} (?:stopped|failed|finished|left) \([^)]*?(\d+) gradients applied\)", ps_log)
            assert applied and int(applied.group(1)) > 0, ps_log[-3000:]
        wait_nothing_left(home)
    finally:
        cleanup_launchers(home)
