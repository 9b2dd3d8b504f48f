"""The placement after re-homing (shoal/train/rehome_placement.py) and the PsClient that drops the
re-homed ps: only the dead ps's shards move, whole, to the least loaded survivors, and the
survivors are renumbered as the client numbers them."""

import numpy as np
import pytest

from shoal.ps.client import PsClient
from shoal.train.errors import TrainError
from shoal.train.placement import Placement, PlacementStrategy, ShardPlacement, place_variables
from shoal.train.rehome_placement import moved_to, rehome
from shoal.wire import JobSecret


def shard(name, ps, nbytes):
    return ShardPlacement(name, name, ps, 0, 1, nbytes)


def test_rehome_moves_only_the_dead_ps_shards_largest_first_to_the_least_loaded_survivor():
    old = Placement((shard("a", 0, 100), shard("b", 1, 50), shard("c", 1, 30), shard("d", 2, 60)), 3)
    new = rehome(old, 1)
    assert new.num_ps == 2
    assert {s.name: s.ps for s in new.shards} == {"a": 0, "b": 1, "c": 0, "d": 1}  # d: was ps 2, now ps 1
    assert moved_to(old, new, 1) == {1: ["b"], 0: ["c"]}
    assert [s.name for s in new.shards] == ["a", "b", "c", "d"]  # shard order (push parts) unchanged


def test_rehome_keeps_shard_boundaries_of_a_partitioned_variable():
    old = place_variables({"W": np.zeros((64, 10)), "b": np.zeros(10)}, 2, PlacementStrategy.GREEDY, 1024)
    new = rehome(old, 1)
    assert [(s.name, s.start, s.stop) for s in new.shards] == [(s.name, s.start, s.stop) for s in old.shards]
    assert all(s.ps == 0 for s in new.shards)


def test_every_task_computes_the_same_rehomed_placement():
    variables = {f"v{i}": np.zeros(100 * (i + 1)) for i in range(7)}
    old = place_variables(variables, 4, PlacementStrategy.GREEDY, 256)
    assert rehome(old, 2) == rehome(place_variables(variables, 4, PlacementStrategy.GREEDY, 256), 2)


@pytest.mark.parametrize("dead, num_ps", [(0, 1), (2, 2), (-1, 2)])
def test_rehome_refuses_the_only_ps_or_an_index_outside_the_placement(dead, num_ps):
    with pytest.raises(TrainError, match=f"ps:{dead}"):
        rehome(Placement((shard("a", 0, 1),), num_ps), dead)


def test_client_drop_renumbers_the_ps_after_the_dropped_one_and_keeps_their_cluster_index():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], JobSecret(b"s" * 32, "test"), timeout_s=1.0)
    client.drop(1)
    assert client.num_ps == 2 and client.addresses == ("127.0.0.1:1", "127.0.0.1:3")
    assert [client.ps_id(k) for k in range(2)] == [0, 2]
    client.drop(0)
    with pytest.raises(ValueError, match="ps:2"):
        client.drop(0)
    client.close()


def test_a_survivor_that_holds_no_shard_takes_none():
    """Round robin puts the softmax's W on ps 0 and b on ps 1; ps 2 holds nothing, so in sync mode
    its step never moved from the start: b, re-homed, goes to ps 0 (still the fuller one)."""
    softmax = place_variables({"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}, 3,
                              PlacementStrategy.ROUND_ROBIN)
    assert [(s.name, s.ps) for s in softmax.shards] == [("W", 0), ("b", 1)]
    assert [(s.name, s.ps) for s in rehome(softmax, 1).shards] == [("W", 0), ("b", 0)]
