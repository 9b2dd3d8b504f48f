"""`shoal check JOB`: a job's processes found by their environment, also those that left their
process group (which no group signal reaches), on this machine."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, run_shoal, status  # noqa: E402

pytestmark = pytest.mark.timeout(90)

LEAVES_A_DAEMON = ("import subprocess; subprocess.Popen(['setsid', 'sleep', '300']); print('left one behind')")


def test_check_finds_a_process_that_left_its_group_and_kill_ends_it(tmp_path):
    home = tmp_path / "home"
    out = run_shoal(home, "run", "--name", "leaky", "--workers", "1", "--", PY, "-c", LEAVES_A_DAEMON, timeout=60)
    assert out.returncode == 0, out.stdout.decode()
    [job] = status(home)
    try:
        check = run_shoal(home, "check", job["id"], timeout=60)
        text = check.stdout.decode()
        assert check.returncode == 6, text
        assert "this machine: worker:0 pid " in text and " still runs: sleep 300" in text
        assert "1 of 1 hosts are not clean; shoal check --kill stops what is left" in text
    finally:
        killed = run_shoal(home, "check", job["id"], "--kill", timeout=60)
    assert killed.returncode == 0, killed.stdout.decode()
    assert "was left running; killed: sleep 300" in killed.stdout.decode()
    again = run_shoal(home, "check", job["id"], timeout=60)
    assert again.returncode == 0 and again.stdout.decode() == "this machine: no process of the job\n"
