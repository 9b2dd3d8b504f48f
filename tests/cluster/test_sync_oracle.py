"""Synchronous training with N workers equals single-process training on the joined batch."""

import math
import re

import numpy as np
import pytest

from tests.cluster.programs import digits

PROGRAM = ["tests/cluster/programs/digits.py"]
STEPS = 12


def oracle(optimizer: str, num_workers: int, steps: int = STEPS, replicas_at=None) -> dict[str, np.ndarray]:
    """Plain single-process training on the concatenated batches, written independently of shoal.ps.
    `replicas_at(t)`, if given, is how many replicas' batches step t averages (a membership that
    changes); else `num_workers` every step."""
    x, y = digits.load_digits_data()
    params = digits.initial_variables()
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    for t in range(steps):
        replicas = replicas_at(t) if replicas_at is not None else num_workers
        idx = np.concatenate([digits.batch_for(r, t, len(y)) for r in range(replicas)])
        _, grads = digits.loss_and_grad(params, x[idx], y[idx])
        for k in params:
            if optimizer == "sgd":
                params[k] = params[k] - 0.5 * grads[k]
            else:  # Adam as in Kingma & Ba with TF's epsilon placement
                lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-8
                m[k] = b1 * m[k] + (1 - b1) * grads[k]
                v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
                lr_t = lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
                params[k] = params[k] - lr_t * m[k] / (np.sqrt(v[k]) + eps)
    return params


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_training_matches_joined_batch_oracle_with_sharded_variables(make_cluster, tmp_path, optimizer,
                                                                        num_workers):
    cluster = make_cluster(num_ps=2, num_workers=num_workers)
    cluster.start_all([*PROGRAM, "--sync", "--optimizer", optimizer, "--steps", str(STEPS), "--out", str(tmp_path)])
    codes = cluster.wait_all(timeout=90)
    assert set(codes.values()) == {0}, cluster.dump()
    expected = oracle(optimizer, num_workers)
    untrained = digits.initial_variables()
    for i in range(num_workers):
        got = np.load(tmp_path / f"worker{i}.npz")
        assert int(got["dropped"]) == 0
        for k, want in expected.items():
            assert not np.allclose(want, untrained[k]), "the oracle must move the parameters"
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-12)
    # W (5 KiB) is partitioned over both ps (min_shard_bytes=1024), so both ps hold a part of it
    assert all("holds " in t.output() for t in cluster.tasks[:2])
    # and the pushes came through shared memory (every task is on loopback): at least one per step
    for ps in cluster.tasks[:2]:
        came = re.search(r"ps:\d: (\d+) requests came through shared memory, (\d+) on the doorbell", ps.output())
        assert came and int(came.group(1)) >= STEPS, cluster.dump()
        assert int(came.group(2)) >= STEPS - 2, "after the first steps, the headers come on the doorbell"


def test_sync_training_through_the_socket_matches_the_oracle_too(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all([*PROGRAM, "--sync", "--steps", str(STEPS), "--out", str(tmp_path), "--no_shared_memory"])
    codes = cluster.wait_all(timeout=90)
    assert set(codes.values()) == {0}, cluster.dump()
    expected = oracle("sgd", 2)
    for i in range(2):
        got = np.load(tmp_path / f"worker{i}.npz")
        for k, want in expected.items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-12)
    assert not any("shared memory" in t.output() for t in cluster.tasks[:2])


def test_sync_with_backup_worker_drops_stale_gradients_and_workers_agree(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=3)
    argv = [*PROGRAM, "--sync", "--replicas_to_aggregate", "2", "--steps", "30", "--step_sleep", "0.02",
            "--out", str(tmp_path)]
    for i in range(2):
        cluster.start("ps", i, argv)
    late = [cluster.start("worker", i, argv) for i in (1, 2)]
    for task in late:  # both backups are up before the chief (worker 0) initializes: a real 3-way race
        task.wait_for_output("waiting for the chief", timeout=60)
    cluster.start("worker", 0, argv)
    codes = cluster.wait_all(timeout=90)
    assert set(codes.values()) == {0}, cluster.dump()
    results = [np.load(tmp_path / f"worker{i}.npz") for i in range(3)]
    assert sum(int(r["dropped"]) for r in results) > 0
    for r in results[1:]:
        np.testing.assert_array_equal(r["W"], results[0]["W"])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sync_in_graph_training_with_two_workers_matches_joined_batch_oracle(make_cluster, tmp_path, optimizer):
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True)
    cluster.start_all(["tests/cluster/programs/coordinator_digits.py", "--optimizer", optimizer, "--steps",
                       str(STEPS), "--steps_per_dispatch", "5", "--out", str(tmp_path)])
    codes = cluster.wait_all(timeout=120)
    assert set(codes.values()) == {0}, cluster.dump()
    got = np.load(tmp_path / "chief.npz")
    assert int(got["step"]) == STEPS and bool(got["applied"])
    expected = oracle(optimizer, 2)
    untrained = digits.initial_variables()
    for k, want in expected.items():
        assert not np.allclose(want, untrained[k]), "the oracle must move the parameters"
        np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-12)
    for worker in cluster.tasks[3:]:  # both workers ran steps
        assert "coordinator finished training (3 runs here)" in worker.output(), worker.output()[-2000:]
