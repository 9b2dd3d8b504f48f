"""`shoal monitor --once` and `shoal status JOB` on a running job, from another process."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, program, recorded_pids, run_shoal, start_shoal, wait_for  # noqa: E402

from shoal.launch.nvml import gpu_usage  # noqa: E402

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
        no_gpus = gpu_usage() is None  # no NVML (or no driver) here
        assert set(rows) == {"ps.0", "worker.0"}
        for row in rows.values():
            # MEM% is 0.0 for these small tasks on a machine of 128 GiB: the MiB used are what must show
            assert row[1] == "RUNNING" and float(row[3]) >= 0 and 0 <= float(row[4]) < 100
            assert re.fullmatch(r"[\d.]+MiB/[\d.]+GiB", row[5]) and float(row[5].split("MiB")[0]) > 0
            assert row[6] == ("-" if no_gpus else "0.0")  # GPU%: none here, or the task uses none
        detail = run_shoal(home, "status", "mon", timeout=30).stdout.decode()
        assert "mon.worker.0  RUNNING" in detail
    finally:
        cleanup(home, launcher)
