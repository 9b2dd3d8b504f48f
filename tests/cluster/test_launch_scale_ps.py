"""`shoal scale JOB ps=N` on a real job (issue 14, launcher side): a detached local job with
ps count 1..2 gets a second ps while it runs; the new ps's TF_CONFIG lists both ps with its own
address at index 1, a worker added after it lists both too, `shoal status` shows it, a ps
scale-down is refused and stops nothing, and when the workers finish every ps stops and no
process of the job is left. Every wait is bounded; nothing is killed by name."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, alive, cleanup_launchers, launcher_pids, program, recorded_pids,  # noqa: E402
                     run_shoal, status, wait_for)


def _job(home: Path) -> dict:
    [job] = status(home)
    return job


def _task(home: Path, name: str) -> dict:
    return next((t for t in _job(home)["tasks"] if t["name"] == name), {})


def _printed(home: Path, name: str) -> dict:
    """What task `name` printed of its TF_CONFIG ({} before it printed it)."""
    for log in home.glob(f"jobs/*/logs/{name}.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("tf_config "):
                return json.loads(line[len("tf_config "):])
    return {}


@pytest.mark.timeout(120)
def test_a_ps_added_to_a_running_job_lists_every_ps_and_stops_with_the_job(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "pg", "--ps", "1..2", "--workers", "1..2", "--detach",
                        "--", PY, program("ps_list.py"))
        assert out.returncode == 0, out.stdout.decode()
        wait_for(lambda: _printed(home, "worker.0"), 30, "worker.0 to print its TF_CONFIG")
        ps0 = _task(home, "ps.0")["address"]
        assert _printed(home, "worker.0")["ps"] == [ps0]

        scaled = run_shoal(home, "scale", "pg", "ps=2", timeout=60)
        assert scaled.returncode == 0, scaled.stdout.decode()
        assert "ps=2 (was 1): started ps:1" in scaled.stdout.decode()
        wait_for(lambda: _printed(home, "ps.1"), 30, "ps.1 to print its TF_CONFIG")
        ps1 = _task(home, "ps.1")["address"]
        assert ps1 and ps1 != ps0
        assert _printed(home, "ps.1") == {"task": {"type": "ps", "index": 1}, "ps": [ps0, ps1]}
        shown = run_shoal(home, "status", "pg", timeout=30).stdout.decode()
        assert any(line.split()[:1] == ["pg.ps.1"] and "RUNNING" in line for line in shown.splitlines()), shown

        added = run_shoal(home, "scale", "pg", "worker=2", timeout=60)
        assert "worker=2 (was 1): started worker:1" in added.stdout.decode(), added.stdout.decode()
        wait_for(lambda: _printed(home, "worker.1"), 30, "worker.1 to print its TF_CONFIG")
        assert _printed(home, "worker.1")["ps"] == [ps0, ps1]

        refused = run_shoal(home, "scale", "pg", "ps=1", timeout=60)
        assert refused.returncode != 0 and "a ps scales up only" in refused.stdout.decode()
        assert _task(home, "ps.1")["state"] == "RUNNING"

        (Path(_job(home)["model_dir"]) / "finish").touch()
        wait_for(lambda: _job(home)["state"] != "RUNNING", 30, "the job to end")
        job = _job(home)
        assert job["state"] == "SUCCEEDED", json.dumps(job, indent=1)
        assert {t["name"] for t in job["tasks"]} == {"ps.0", "ps.1", "worker.0", "worker.1"}
        assert all(t["state"] in ("SUCCEEDED", "KILLED") for t in job["tasks"]), job["tasks"]
        pids = recorded_pids(home) + launcher_pids(home)
        wait_for(lambda: not alive(pids), 15, f"every process of the job to end ({alive(pids)} still run)")
    finally:
        cleanup_launchers(home)
