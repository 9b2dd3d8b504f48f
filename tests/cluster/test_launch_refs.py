"""Job references with real jobs: a name run twice means its newest job, job numbers in the
launcher's first line and in `shoal status`; `shoal tensorboard` serves the directory the
tasks reported and stops TensorBoard (its whole process group) when it is stopped."""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, REPO, alive, cleanup, program, run_shoal, shoal_env,  # noqa: E402
                     status, wait_for)

pytestmark = pytest.mark.timeout(120)


def test_a_name_run_twice_means_its_newest_job(tmp_path):
    home = tmp_path / "home"
    try:
        for steps in ("1", "2"):
            out = run_shoal(home, "run", "--name", "twice", "--workers", "1", "--",
                            PY, program("work.py"), "--steps", steps, timeout=60)
            assert out.returncode == 0, out.stdout.decode()
        first_line = out.stdout.decode().splitlines()[0]
        newest, older = status(home)
        assert (newest["number"], older["number"]) == (2, 1)
        assert first_line.startswith(f"shoal | job 2 {newest['id']}: 1 task,")
        logs = run_shoal(home, "logs", "twice", timeout=30)
        assert logs.returncode == 0, logs.stdout.decode()
        assert logs.stdout.decode().count("step=") == 2
        by_task = run_shoal(home, "logs", "1.worker.0", timeout=30)
        assert by_task.stdout.decode().count("step=") == 1
        killed = run_shoal(home, "kill", "twice", timeout=30)
        assert killed.returncode == 0 and newest["id"] in killed.stdout.decode()
    finally:
        cleanup(home)


def fake_tensorboard(tmp_path: Path) -> Path:
    """A `tensorboard` that writes its arguments, starts a child (same group) and waits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tensorboard"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$@\" > {tmp_path / 'args.txt'}\n"
        "sleep 300 &\n"
        f"echo $$ $! > {tmp_path / 'pids.txt'}\n"
        "wait\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_tensorboard_serves_the_reported_dir_and_stops_with_shoal(tmp_path):
    home = tmp_path / "home"
    wrote = tmp_path / "my-summaries"
    out = run_shoal(home, "run", "--name", "tb", "--ps", "1", "--workers", "2", "--",
                    PY, program("summaries.py"), "--dir", str(wrote), timeout=60)
    assert out.returncode == 0, out.stdout.decode()
    [job] = status(home)
    assert {t["name"]: t["summaries"] for t in job["tasks"]} == {
        "ps.0": "", "worker.0": str(wrote), "worker.1": str(wrote / "worker_1")}
    env = shoal_env(home, PATH=f"{fake_tensorboard(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    shoal = subprocess.Popen([PY, "-m", "shoal.cli.main", "tensorboard", "tb"], cwd=str(REPO),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    pids = []
    try:
        wait_for(lambda: (tmp_path / "pids.txt").exists()
                 and len((tmp_path / "pids.txt").read_text().split()) == 2, 30,
                 "the fake tensorboard and its child")
        pids = [int(p) for p in (tmp_path / "pids.txt").read_text().split()]
        assert (tmp_path / "args.txt").read_text().split()[:2] == ["--logdir", str(wrote)]
        assert str(job["model_dir"]) not in (tmp_path / "args.txt").read_text()
        shoal.send_signal(signal.SIGTERM)
        assert shoal.wait(30) == 130
        wait_for(lambda: not alive(pids), 10, "tensorboard and its child to be gone")
    finally:
        cleanup(home, shoal)
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)
