"""Where the ps are decides what the placement weighs: on one machine the MLP is one request per
step, to ps 0; across hosts its first layer is split over the ps, as before."""

import numpy as np
import pytest

from shoal.train.placement import DEFAULT_MIN_SHARD_BYTES, REQUEST_COST_BYTES, place_variables
from shoal.train.shard_costs import LOOPBACK_MIN_SHARD_BYTES, LOOPBACK_REQUEST_COST_BYTES, shard_costs_for

MLP = {"W1": np.zeros((784, 256), np.float32), "b1": np.zeros(256, np.float32),
       "W2": np.zeros((256, 10), np.float32), "b2": np.zeros(10, np.float32)}


def _place(variables, addresses, min_shard_bytes=None):
    costs = shard_costs_for(min_shard_bytes, addresses)
    return place_variables(variables, len(addresses), min_shard_bytes=costs.min_shard_bytes,
                           request_cost_bytes=costs.request_cost_bytes)


def test_every_ps_on_loopback_takes_the_one_machine_costs():
    costs = shard_costs_for(None, ["127.0.0.1:2222", "localhost:2223"])
    assert (costs.min_shard_bytes, costs.request_cost_bytes) == (LOOPBACK_MIN_SHARD_BYTES, LOOPBACK_REQUEST_COST_BYTES)


@pytest.mark.parametrize("addresses", [["127.0.0.1:2222", "10.0.0.2:2222"], ["node1:2222", "node2:2222"]])
def test_any_ps_elsewhere_takes_the_link_costs(addresses):
    costs = shard_costs_for(None, addresses)
    assert (costs.min_shard_bytes, costs.request_cost_bytes) == (DEFAULT_MIN_SHARD_BYTES, REQUEST_COST_BYTES)


def test_a_min_shard_size_given_is_kept():
    assert shard_costs_for(1024, ["127.0.0.1:2222"]).min_shard_bytes == 1024


def test_the_mlp_on_one_machine_is_one_request_per_step_to_ps_0():
    placement = _place(MLP, ["127.0.0.1:2222", "127.0.0.1:2223"])
    assert {s.name: s.ps for s in placement.shards} == {"W1": 0, "b1": 0, "W2": 0, "b2": 0}


def test_the_mlp_across_hosts_splits_its_first_layer_over_the_ps():
    placement = _place(MLP, ["10.0.0.1:2222", "10.0.0.2:2222"])
    assert [(s.name, s.ps) for s in placement.shards] == [("W1/part_0", 0), ("W1/part_1", 1), ("b1", 1), ("W2", 0),
                                                          ("b2", 1)]


def test_a_larger_model_on_one_machine_still_spreads():
    big = {"W1": np.zeros((784, 1024), np.float32), "W2": np.zeros((1024, 1024), np.float32)}  # 3.2 + 4.2 MB
    placement = _place(big, ["127.0.0.1:2222", "127.0.0.1:2223"])
    assert {s.ps for s in placement.shards} == {0, 1}
