"""What the launcher says when a job goes wrong, with real processes: a failed job ends with
its root cause (first failed task, exit, last lines of its output), which `shoal status JOB`
shows too; a usage error (exit 2 at once) is not restarted; a missing script starts nothing."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, alive, cleanup, program, recorded_pids, run_shoal, status  # noqa: E402

pytestmark = pytest.mark.timeout(90)

FAILS_ON_WORKER_1 = """
import os, time
if os.environ["SHOAL_TASK"] == "worker:1":
    print("loading shard 1", flush=True)
    time.sleep(0.3)
    raise ValueError("bad batch in shard 1")
time.sleep(60)
"""


def test_failed_job_ends_with_the_root_cause_and_status_shows_it(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "rc", "--workers", "2", "--", PY, "-c", FAILS_ON_WORKER_1, timeout=60)
        text = out.stdout.decode()
        assert out.returncode == 1, text
        tail = text.rstrip().splitlines()[-12:]  # the cause is in the last lines of the output
        assert "shoal | Root cause (first observed failure):" in tail, text
        assert "shoal |   task:      rc.worker.1" in tail
        assert "shoal |   exit:      exit 1" in tail
        assert "shoal |     ValueError: bad batch in shard 1" in tail
        assert alive(recorded_pids(home)) == []
        [job] = status(home)
        assert job["root_cause"]["task"] == "worker.1" and job["root_cause"]["exit_code"] == 1
        shown = run_shoal(home, "status", job["id"], timeout=30).stdout.decode()
        assert "Root cause (first observed failure):" in shown and "ValueError: bad batch in shard 1" in shown
    finally:
        cleanup(home)


def test_a_usage_error_is_not_restarted(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "usage", "--workers", "1", "--restart", "on-failure", "--",
                        PY, program("work.py"), "--no-such-flag", timeout=60)
        text = out.stdout.decode()
        assert out.returncode == 2, text  # the chief's (worker.0's) code
        assert "RESTARTING" not in text
        assert "exit 2 within 1s of its start, a usage error: not restarted" in text
        assert "shoal |     work.py: error: unrecognized arguments: --no-such-flag" in text
    finally:
        cleanup(home)


def test_a_missing_script_starts_nothing(tmp_path):
    home = tmp_path / "home"
    out = run_shoal(home, "run", "--workers", "2", "--restart", "on-failure", "--", "python", "missing.py",
                    cwd=tmp_path, timeout=30)
    text = out.stdout.decode()
    assert out.returncode == 3, text
    assert text.count("\n") == 1 and f"{tmp_path / 'missing.py'}, which does not exist" in text
    assert not (home / "jobs").exists()
