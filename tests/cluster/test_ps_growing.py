"""Growing a running job (issue 14) with real processes: a ps started mid-training with a cluster
that lists it at the next index registers with ps:0, the chief moves shards onto it, and every
worker follows without restarting. In sync mode the final model equals the joined-batch oracle
(every gradient applied exactly once); in async mode training still converges; a worker started
after the growth trains against the grown placement."""

import re
import time

import numpy as np
import pytest

from shoal.ps.client import PsClient
from shoal.wire import JobSecret, WireError
from tests.cluster.harness import free_ports
from tests.cluster.programs import digits
from tests.cluster.test_sync_oracle import oracle

JOIN_LINE = re.compile(r"ps:2 joined: (\d+) shards? \(([\d.]+ \w+)\) moved to it from (ps:\d(?:, ps:\d)*) at step (\d+)")


def _train_then_add_ps2(make_cluster, argv):
    """A job of 2 ps and 2 workers running `argv`, and ps:2 (a cluster that lists it at the next
    index) started once both workers train. Returns (cluster, the grown spec, ps:2's task)."""
    cluster = make_cluster(num_ps=2, num_workers=2)
    for i in range(2):
        cluster.start("ps", i, argv)
    for i in range(2):
        cluster.start("worker", i, argv)
    spec = dict(cluster.spec, ps=[*cluster.spec["ps"], f"127.0.0.1:{free_ports(1)[0]}"])
    cluster.tasks[2].wait_for_output("starts at global step", timeout=60)
    cluster.tasks[3].wait_for_output("starts at global step", timeout=60)
    return cluster, spec, cluster.start("ps", 2, argv, spec=spec)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_ps_added_mid_training_gets_shards_and_the_model_equals_the_oracle(make_cluster, tmp_path, optimizer):
    steps = 120
    argv = ["tests/cluster/programs/digits.py", "--sync", "--optimizer", optimizer, "--steps", str(steps),
            "--step_sleep", "0.05", "--out", str(tmp_path)]
    cluster, _, ps2 = _train_then_add_ps2(make_cluster, argv)
    codes = cluster.wait_all(timeout=150)
    assert codes == {"ps:0": 0, "ps:1": 0, "ps:2": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief, other = cluster.tasks[2].output(), cluster.tasks[3].output()
    joined = JOIN_LINE.search(chief)
    assert joined, chief[-3000:]
    assert int(joined.group(1)) >= 1 and int(joined.group(4)) < steps
    assert "trains on with ps:2 joined" in other, other[-3000:]
    assert "took over" not in ps2.output()  # one source: built with init, no adopt
    expected = oracle(optimizer, 2, steps)
    for i in range(2):
        got = np.load(tmp_path / f"worker{i}.npz")
        assert int(got["dropped"]) == 0 and int(got["applied"]) == steps  # no step lost or doubled on this worker
        for k, want in expected.items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-12)


def test_async_ps_added_mid_training_serves_its_shards_and_training_converges(make_cluster, tmp_path):
    steps = 1200  # about 12 s of training: ps:2 (a new interpreter) joins well before the end on a loaded machine
    argv = ["tests/cluster/programs/digits.py", "--steps", str(steps), "--step_sleep", "0.02", "--out", str(tmp_path)]
    cluster, spec, _ = _train_then_add_ps2(make_cluster, argv)
    cluster.tasks[2].wait_for_output("ps:2 joined:", timeout=60)
    client = PsClient([spec["ps"][2]], JobSecret(cluster.secret.encode(), "test"), timeout_s=5.0)
    try:
        first = client.status(0, 5.0)
        assert first.shards > 0, first
        deadline = time.monotonic() + 30
        while client.status(0, 5.0).step <= first.step:
            assert time.monotonic() < deadline, f"ps:2's step did not advance past {first.step}\n{cluster.dump()}"
            time.sleep(0.05)
    except WireError:
        pytest.fail(f"ps:2 stopped answering while the job trained\n{cluster.dump()}")
    finally:
        client.close()
    codes = cluster.wait_all(timeout=150)
    assert codes == {"ps:0": 0, "ps:1": 0, "ps:2": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    assert JOIN_LINE.search(cluster.tasks[2].output())
    x, y = digits.load_digits_data()
    for i in range(2):
        got = np.load(tmp_path / f"worker{i}.npz")
        accuracy = float(((x @ got["W"] + got["b"]).argmax(axis=1) == y).mean())
        assert accuracy >= 0.90, accuracy


def test_a_worker_started_after_the_growth_trains_against_the_grown_placement(make_cluster, tmp_path):
    argv = ["tests/cluster/programs/digits.py", "--sync", "--steps", "150", "--step_sleep", "0.1", "--out",
            str(tmp_path)]
    cluster, _, _ = _train_then_add_ps2(make_cluster, argv)
    cluster.tasks[2].wait_for_output("ps:2 joined:", timeout=60)
    late_spec = dict(cluster.spec, worker=[*cluster.spec["worker"], f"127.0.0.1:{free_ports(1)[0]}"])
    late = cluster.start("worker", 2, argv, spec=late_spec)
    codes = cluster.wait_all(timeout=150)
    assert codes == {"ps:0": 0, "ps:1": 0, "ps:2": 0, "worker:0": 0, "worker:1": 0, "worker:2": 0}, cluster.dump()
    held = r"ps:0 \(\d shards?\), ps:1 \(\d shards?\), ps:2 \(\d shards?\)"  # no ps holds none: no "; ..."
    assert re.search(rf"worker:2 starts with ps:2 \(joined before it started\): the shards are on {held}\n",
                     late.output()), late.output()[-3000:]
    late_result, chief_result = np.load(tmp_path / "worker2.npz"), np.load(tmp_path / "worker0.npz")
    assert int(late_result["applied"]) > 0, cluster.dump()
    for k in digits.initial_variables():
        np.testing.assert_array_equal(late_result[k], chief_result[k])  # sync: every replica ends with the same model
