"""Whole variables <-> ps shards: a checkpoint saved with N ps restores into M ps."""

import numpy as np
import pytest

from shoal.ps.optimizers import Adam
from shoal.ps.store import ShardStore
from shoal.ps.errors import PsError
from shoal.train.checkpoint import CheckpointError
from shoal.train.placement import place_variables
from shoal.train.snapshot import check_fits, gather, scatter


def _variables():
    rng = np.random.default_rng(0)
    return {"W": rng.normal(size=(300, 8)), "b": rng.normal(size=8), "scale": np.array(2.0)}


def _slots(variables):
    return {n: {"m": v * 10, "v": v * 100, "t": np.array(5, np.int64)} for n, v in variables.items()}


@pytest.mark.parametrize("from_ps,to_ps", [(2, 3), (3, 2), (1, 4)])
def test_scatter_then_gather_through_ps_stores_reshards_values_and_slots(from_ps, to_ps):
    variables, slots = _variables(), _slots(_variables())
    placement = place_variables(variables, to_ps, min_shard_bytes=1024)
    assert len([s for s in placement.shards if s.variable == "W"]) == to_ps  # W is partitioned
    stores = []
    for ps, tensors in enumerate(scatter(placement, variables, slots)):
        store = ShardStore(f"ps:{ps}")
        values = {k: v for k, v in tensors.items() if "@" not in k}
        per_shard = {}
        for key, value in tensors.items():
            if "@" in key:
                shard, _, slot = key.rpartition("@")
                per_shard.setdefault(shard, {})[slot] = value
        store.create(values, Adam(), per_shard)
        stores.append(store)
    got_vars, got_slots = gather(placement, [s.snapshot() for s in stores])
    for name in variables:
        np.testing.assert_array_equal(got_vars[name], variables[name])
        for slot in ("m", "v", "t"):
            np.testing.assert_array_equal(got_slots[name][slot], slots[name][slot])
    assert got_slots["W"]["t"].shape == ()


def test_slot_that_does_not_fit_the_update_rule_is_refused():
    store = ShardStore("ps:0")
    with pytest.raises(PsError, match=r"W@m .*does not fit adam"):
        store.create({"W": np.zeros((4, 2))}, Adam(), {"W": {"m": np.zeros((3, 2))}})


def test_checkpoint_of_another_model_is_refused_with_the_difference():
    with pytest.raises(CheckpointError, match=r"missing \['b'\].*fresh --model_dir"):
        check_fits({"W": np.zeros(3), "b": np.zeros(2)}, {"W": np.zeros(3)}, "ckpt-1")
    with pytest.raises(CheckpointError, match=r"'W' .*float64\[4\].*float64\[3\]"):
        check_fits({"W": np.zeros(3)}, {"W": np.zeros(4)}, "ckpt-1")


def test_gradient_buffer_is_reused_per_shard_and_refused_on_mismatch():
    store = ShardStore("ps:0")
    store.create({"W": np.zeros((4, 2), np.float32)}, Adam())
    first = store.gradient_buffer("W", np.dtype(np.float32), (4, 2))
    assert first is store.gradient_buffer("W", np.dtype(np.float32), (4, 2))
    assert store.gradient_buffer("W", np.dtype(np.float64), (4, 2)) is None
    assert store.gradient_buffer("W", np.dtype(np.float32), (2, 4)) is None
    assert store.gradient_buffer("nope", np.dtype(np.float32), (4, 2)) is None
