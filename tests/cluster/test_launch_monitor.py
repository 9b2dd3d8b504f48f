"""`shoal monitor --once` and `shoal status JOB` on a running job, from another process."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, program, recorded_pids, run_shoal, start_shoal, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_monitor_once_and_status_show_each_running_task(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "mon", "--ps", "1", "--workers", "1", "--",
                           PY, program("serve.py"))
    try:
        wait_for(lambda: len(recorded_pids(home)) == 2, 20, "both tasks to start")
        out = run_shoal(home, "monitor", "mon", "--once", timeout=30)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        lines = text.splitlines()
        assert lines[1].split() == ["TASK", "STATE", "PID", "CPU%", "MEM%", "MEM", "USED/TOTAL",
                                    "GPU%", "GPU", "MEM"]
        rows = {line.split()[0]: line.split() for line in lines[2:]}
        assert set(rows) == {"ps.0", "worker.0"}
        for row in rows.values():
            assert row[1] == "RUNNING" and float(row[3]) >= 0 and 0 < float(row[4]) < 100
            assert "MiB/" in row[5] and row[6] == "-"  # no GPU here
        detail = run_shoal(home, "status", "mon", timeout=30).stdout.decode()
        assert "mon.worker.0  RUNNING" in detail
    finally:
        cleanup(home, launcher)
