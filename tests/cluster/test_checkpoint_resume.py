"""A job restarted with the same model dir carries on from its newest checkpoint — exactly."""

import numpy as np

from shoal.train.checkpoint import list_checkpoints

PROGRAM = ["tests/cluster/programs/digits.py", "--sync", "--optimizer", "adam"]


def _run(make_cluster, out, num_ps, steps, model_dir=None, num_workers=2, extra=()):
    out.mkdir(exist_ok=True)
    cluster = make_cluster(num_ps=num_ps, num_workers=num_workers)
    argv = [*PROGRAM, "--steps", str(steps), "--out", str(out), *extra]
    if model_dir is not None:
        argv += ["--model_dir", str(model_dir)]
    cluster.start_all(argv)
    codes = cluster.wait_all(timeout=90)
    assert set(codes.values()) == {0}, cluster.dump()
    return cluster, {k: v for k, v in np.load(out / "worker0.npz").items() if k not in ("dropped", "applied")}


def test_resumed_sync_run_ends_with_the_same_parameters_as_an_uninterrupted_one(make_cluster, tmp_path):
    model_dir = tmp_path / "model"
    first, _ = _run(make_cluster, tmp_path / "a", 2, 10, model_dir)
    assert "saved checkpoint step=10" in first.tasks[2].output()
    resumed, got = _run(make_cluster, tmp_path / "b", 2, 20, model_dir)
    assert "restored checkpoint step=10" in resumed.tasks[2].output()
    _, want = _run(make_cluster, tmp_path / "c", 2, 20)
    _, halfway = _run(make_cluster, tmp_path / "d", 2, 10)
    for name in want:
        assert not np.allclose(want[name], halfway[name]), "the second half must move the parameters"
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-12)


def test_checkpoint_restores_into_a_different_number_of_ps_tasks(make_cluster, tmp_path):
    """2 ps -> 3 ps -> 2 ps; W is partitioned over every ps each time (Adam's slots with it)."""
    model_dir = tmp_path / "model"
    _run(make_cluster, tmp_path / "a", 2, 8, model_dir)
    three, _ = _run(make_cluster, tmp_path / "b", 3, 16, model_dir)
    assert "restored checkpoint step=8" in three.tasks[3].output()
    assert all("holds 2 shards" in ps.output() or "holds 1 shard (" in ps.output() for ps in three.tasks[:3])
    two, got = _run(make_cluster, tmp_path / "c", 2, 24, model_dir)
    assert "restored checkpoint step=16" in two.tasks[2].output()
    _, want = _run(make_cluster, tmp_path / "d", 2, 24)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-12)


def test_corrupt_newest_checkpoint_restores_the_previous_one_with_a_warning(make_cluster, tmp_path):
    model_dir = tmp_path / "model"
    _run(make_cluster, tmp_path / "a", 2, 10, model_dir=model_dir, num_workers=1,
         extra=["--checkpoint_every_steps", "5"])
    newest = list_checkpoints(model_dir)[-1]
    assert newest.name == "ckpt-0000000010" and len(list_checkpoints(model_dir)) >= 2
    with open(newest / "optimizer.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)  # a copy cut short
    resumed, _ = _run(make_cluster, tmp_path / "b", 2, 12, model_dir=model_dir, num_workers=1)
    log = resumed.tasks[2].output()
    assert "skipping damaged checkpoint" in log and "ckpt-0000000010" in log
    assert "restored checkpoint step=5" in log
