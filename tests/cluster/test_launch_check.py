"""Processes a job left on this machine outside its tasks' process groups (which no group signal
reaches), found by their environment: the launcher kills them when the job ends and says so,
and `shoal check JOB [--kill]` finds (and kills) them while the job runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, alive, cleanup, grandchild_pids, run_shoal, start_shoal, status, task_log,  # noqa: E402
                     wait_for)

pytestmark = pytest.mark.timeout(90)

# The daemon is named once it is one: out of this process's session and running `sleep` (a group
# kill that came before would have ended it with the task).
LEAVES_A_DAEMON = ("import os, subprocess, sys, time; p = subprocess.Popen(['setsid', 'sleep', '300']);"
                   " end = time.monotonic() + 30\n"
                   "while (os.getsid(p.pid) == os.getsid(0) or open(f'/proc/{p.pid}/comm').read().strip() != 'sleep')"
                   " and time.monotonic() < end: time.sleep(0.01)\n"
                   "print(f'grandchild pid {p.pid}', flush=True); time.sleep(float(sys.argv[1]))")


def test_the_launcher_kills_a_process_that_left_its_group_when_the_job_ends_and_says_so(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "leaky", "--workers", "1", "--", PY, "-c", LEAVES_A_DAEMON, "0",
                        timeout=60)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        [daemon] = grandchild_pids(home)
        assert f"shoal | this machine: worker:0 pid {daemon} (sleep 300) of job " in text, text
        assert "still ran after the job, outside its task's process group; killed" in text, text
        assert alive([daemon]) == []
        [job] = status(home)
        again = run_shoal(home, "check", job["id"], timeout=60)
        assert again.returncode == 0 and again.stdout.decode() == "this machine: no process of the job\n"
    finally:
        cleanup(home)


def test_check_finds_a_process_that_left_its_group_and_kill_ends_it(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "leaky", "--workers", "1", "--", PY, "-c", LEAVES_A_DAEMON, "300")
    try:
        wait_for(lambda: "grandchild pid" in task_log(home, "worker.0"), 60, "the daemon started")
        [job] = status(home)
        check = run_shoal(home, "check", job["id"], timeout=60)
        text = check.stdout.decode()
        assert check.returncode == 6, text
        assert "this machine: worker:0 pid " in text and " still runs: sleep 300" in text, text
        assert f"1 of 1 hosts are not clean; it is running: shoal kill {job['id']} stops it" in text, text
        killed = run_shoal(home, "check", job["id"], "--kill", timeout=60)
        assert killed.returncode == 0, killed.stdout.decode()
        assert "was left running; killed: sleep 300" in killed.stdout.decode()
        assert alive(grandchild_pids(home)) == []
    finally:
        cleanup(home, launcher)
