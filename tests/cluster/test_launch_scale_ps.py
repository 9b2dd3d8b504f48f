"""`shoal scale JOB ps=N` on a real job (issue 14, launcher side): a detached local job with
ps count 1..2 gets a second ps while it runs; the new ps's TF_CONFIG lists both ps with its own
address at index 1, a worker added after it lists the ps the job started with, `shoal status` shows it, a ps
scale-down is refused and stops nothing, and when the workers finish every ps stops and no
process of the job is left. Every wait is bounded; nothing is killed by name."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, cleanup_launchers, only_job, program, run_ok, run_shoal, task_log,  # noqa: E402
                     wait_for, wait_nothing_left)


def _task(home: Path, name: str) -> dict:
    return next((t for t in only_job(home)["tasks"] if t["name"] == name), {})


def _printed(home: Path, name: str) -> dict:
    """What task `name` printed of its TF_CONFIG ({} before it printed it)."""
    for line in task_log(home, name).splitlines():
        if line.startswith("tf_config "):
            return json.loads(line[len("tf_config "):])
    return {}


@pytest.mark.timeout(120)
def test_a_ps_added_to_a_running_job_lists_every_ps_and_stops_with_the_job(tmp_path):
    home = tmp_path / "home"
    try:
        run_ok(home, "run", "--name", "pg", "--ps", "1..2", "--workers", "1..2", "--detach", "--", PY,
               program("ps_list.py"))
        wait_for(lambda: _printed(home, "worker.0"), 30, "worker.0 to print its TF_CONFIG")
        ps0 = _task(home, "ps.0")["address"]
        assert _printed(home, "worker.0")["ps"] == [ps0]

        assert "ps=2 (was 1): started ps:1" in run_ok(home, "scale", "pg", "ps=2")
        wait_for(lambda: _printed(home, "ps.1"), 30, "ps.1 to print its TF_CONFIG")
        ps1 = _task(home, "ps.1")["address"]
        assert ps1 and ps1 != ps0
        assert _printed(home, "ps.1") == {"task": {"type": "ps", "index": 1}, "ps": [ps0, ps1]}
        shown = run_shoal(home, "status", "pg", timeout=30).stdout.decode()
        assert any(line.split()[:1] == ["pg.ps.1"] and "RUNNING" in line for line in shown.splitlines()), shown

        added = run_shoal(home, "scale", "pg", "worker=2", timeout=60)
        assert "worker=2 (was 1): started worker:1" in added.stdout.decode(), added.stdout.decode()
        wait_for(lambda: _printed(home, "worker.1"), 30, "worker.1 to print its TF_CONFIG")
        assert _printed(home, "worker.1")["ps"] == [ps0]  # the ps the job started with: ps:1 it learns from the ps

        refused = run_shoal(home, "scale", "pg", "ps=1", timeout=60)
        assert refused.returncode != 0 and "a ps scales up only" in refused.stdout.decode()
        assert _task(home, "ps.1")["state"] == "RUNNING"

        (Path(only_job(home)["model_dir"]) / "finish").touch()
        wait_for(lambda: only_job(home)["state"] != "RUNNING", 30, "the job to end")
        job = only_job(home)
        assert job["state"] == "SUCCEEDED", json.dumps(job, indent=1)
        assert {t["name"] for t in job["tasks"]} == {"ps.0", "ps.1", "worker.0", "worker.1"}
        assert all(t["state"] in ("SUCCEEDED", "KILLED") for t in job["tasks"]), job["tasks"]
        wait_nothing_left(home)
    finally:
        cleanup_launchers(home)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, steps", [([], 40000), (["--sync"], 8000)], ids=["async", "sync"])
def test_mnist_scaled_to_three_ps_moves_shards_onto_the_new_one_and_succeeds(tmp_path, mode, steps):
    """Launcher and runtime together: `shoal scale JOB ps=3` on the seed example starts ps:2, it
    registers with ps:0, the chief moves shards onto it, every worker follows without a restart, a
    worker added after that (listing the ps the job started with) learns the grown placement
    from the ps, the added ps serves until the end, and the job succeeds with the usual accuracy. Parts of 8 KiB
    cut the 31 KiB weight matrix into shards that can move (one shard per ps would stay put)."""
    home = tmp_path / "home"
    try:
        run_ok(home, "run", "--name", "grow", "--ps", "2..3", "--workers", "2..3", "--detach", "--", "python",
               "examples/mnist_softmax.py", "--steps", str(steps), "--push_part_bytes", "8192", *mode)
        wait_for(lambda: "step=" in task_log(home, "worker.1"), 60, "worker.1 to train")

        scaled = run_ok(home, "scale", "grow", "ps=3")
        assert "ps=3 (was 2): started ps:2" in scaled, scaled
        joined = re.compile(r"ps:2 joined: (\d+) shards? \([^)]*\) moved to it from (ps:\d(?:, ps:\d)*) at step (\d+)")
        wait_for(lambda: joined.search(task_log(home, "worker.0")), 60, "the chief to move shards onto ps:2")
        moved = joined.search(task_log(home, "worker.0"))
        assert int(moved.group(1)) >= 1 and int(moved.group(3)) < steps
        added = run_shoal(home, "scale", "grow", "worker=3", timeout=60)
        assert "worker=3 (was 2): started worker:2" in added.stdout.decode(), added.stdout.decode()
        wait_for(lambda: "step=" in task_log(home, "worker.2"), 60, "worker.2, added after the growth, to train")
        assert "worker:2 starts with ps:2 (joined before it started)" in task_log(home, "worker.2"), \
            task_log(home, "worker.2")[-3000:]

        wait_for(lambda: only_job(home)["state"] != "RUNNING", 240, "the job to end")
        job = only_job(home)
        assert job["state"] == "SUCCEEDED", json.dumps(job, indent=1)
        states = {t["name"]: t["state"] for t in job["tasks"]}
        assert {n: s for n, s in states.items() if n.startswith("worker")} == {
            "worker.0": "SUCCEEDED", "worker.1": "SUCCEEDED", "worker.2": "SUCCEEDED"}, states
        # every ps, the added one too, ended with the job: by itself, or stopped by the teardown
        assert {n: s in ("SUCCEEDED", "KILLED") for n, s in states.items() if n.startswith("ps")} == {
            "ps.0": True, "ps.1": True, "ps.2": True}, states
        assert "trains on with ps:2 joined" in task_log(home, "worker.1"), task_log(home, "worker.1")[-3000:]
        for name in ("worker.0", "worker.1", "worker.2"):
            accuracy = re.findall(r"accuracy: ([\d.]+)", task_log(home, name))
            assert accuracy and float(accuracy[-1]) >= 0.90, task_log(home, name)[-3000:]
        wait_nothing_left(home)
    finally:
        cleanup_launchers(home)
