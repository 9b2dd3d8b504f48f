import numpy as np
import pytest

from shoal.train import PlacementStrategy, TrainError, place_variables


def test_large_variable_is_partitioned_into_row_ranges_on_distinct_ps():
    variables = {"emb": np.zeros((1000, 256), np.float32), "b": np.zeros(10, np.float32)}  # emb: 1 MB
    placement = place_variables(variables, num_ps=3, min_shard_bytes=256 << 10)
    parts = [s for s in placement.shards if s.variable == "emb"]
    assert [s.name for s in parts] == ["emb/part_0", "emb/part_1", "emb/part_2"]
    assert parts[0].start == 0 and parts[-1].stop == 1000
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
    assert len({s.ps for s in parts}) == 3


def test_partition_respects_minimum_shard_size():
    placement = place_variables({"w": np.zeros((100, 1024), np.float32)}, num_ps=8, min_shard_bytes=100 << 10)
    assert len(placement.shards) == 4  # 400 KiB / 100 KiB, not 8


def test_small_variables_are_not_partitioned():
    placement = place_variables({"w": np.zeros((784, 10), np.float32)}, num_ps=4)
    assert [s.name for s in placement.shards] == ["w"]


def test_greedy_balances_bytes_across_ps():
    variables = {"a": np.zeros(100_000), "b": np.zeros(60_000), "c": np.zeros(50_000), "d": np.zeros(10_000)}
    placement = place_variables(variables, num_ps=2, strategy=PlacementStrategy.GREEDY, min_shard_bytes=1 << 30)
    load = [sum(s.nbytes for s in placement.on_ps(i)) for i in range(2)]
    assert load == [880_000, 880_000]


def test_greedy_keeps_small_variables_on_a_ps_already_used():
    """The softmax: its bias (40 bytes) goes with its weights, so a push is one request, not two;
    a third ps stays empty too. A variable too large to share a ps without unbalancing them
    (here 2 x 300 KB) still gets a ps of its own."""
    softmax = {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    for num_ps in (2, 3):
        placement = place_variables(softmax, num_ps=num_ps)
        assert [(s.name, s.ps) for s in placement.shards] == [("W", 0), ("b", 0)]
        assert placement.push_parts(None) == ((0, ("W", "b")),)
    two = place_variables({"w1": np.zeros(300_000, np.uint8), "w2": np.zeros(300_000, np.uint8),
                           "bias": np.zeros(10, np.float32)}, num_ps=2)
    assert sorted(s.ps for s in two.shards if s.variable != "bias") == [0, 1]
    assert len(two.push_parts(None)) == 2


def test_greedy_never_piles_many_small_variables_on_one_ps():
    """Each of 1000 variables of 32 kB is too small to be worth a request of its own, but all of
    them on ps 0 would leave the other ps idle: by bytes alone wins there."""
    for num_ps, nbytes in ((2, 32_000), (4, 16_000), (8, 8_000)):
        placement = place_variables({f"v{i}": np.zeros(nbytes, np.uint8) for i in range(1000)}, num_ps=num_ps)
        load = [sum(s.nbytes for s in placement.on_ps(i)) for i in range(num_ps)]
        assert max(load) - min(load) <= nbytes, (num_ps, load)


def test_greedy_spreads_the_mlp_as_by_bytes_alone():
    mlp = {"W1": np.zeros((784, 256), np.float32), "b1": np.zeros(256, np.float32),
           "W2": np.zeros((256, 10), np.float32), "b2": np.zeros(10, np.float32)}
    placement = place_variables(mlp, num_ps=2)
    assert [(s.name, s.ps) for s in placement.shards] == [("W1/part_0", 0), ("W1/part_1", 1), ("b1", 1), ("W2", 0),
                                                          ("b2", 1)]


def test_round_robin_assigns_in_declaration_order():
    variables = {name: np.zeros(3) for name in "abcde"}
    placement = place_variables(variables, num_ps=2, strategy=PlacementStrategy.ROUND_ROBIN)
    assert [s.ps for s in placement.shards] == [0, 1, 0, 1, 0]


def test_split_gives_views_that_cover_each_variable():
    w = np.arange(40.0).reshape(20, 2)
    placement = place_variables({"w": w}, num_ps=2, min_shard_bytes=64)
    per_ps = placement.split({"w": w})
    np.testing.assert_array_equal(np.concatenate([per_ps[0]["w/part_0"], per_ps[1]["w/part_1"]]), w)
    assert np.shares_memory(per_ps[0]["w/part_0"], w)


def test_no_ps_is_a_clear_error():
    with pytest.raises(TrainError, match="no ps tasks"):
        place_variables({"w": np.zeros(3)}, num_ps=0)


def test_part_bytes_cuts_a_variable_larger_than_a_part_on_one_ps():
    placement = place_variables({"w": np.zeros((784, 256), np.float32)}, num_ps=1, part_bytes=256 << 10)
    assert [s.name for s in placement.shards] == [f"w/part_{i}" for i in range(4)]  # 784 KiB in 4 parts
    assert all(s.ps == 0 for s in placement.shards) and placement.shards[-1].stop == 784


def test_push_parts_group_small_shards_and_keep_each_ps_in_order():
    variables = {"w": np.zeros((512, 256), np.float32), "b": np.zeros(256, np.float32), "c": np.zeros(10, np.float32)}
    placement = place_variables(variables, num_ps=2, strategy=PlacementStrategy.ROUND_ROBIN, part_bytes=200 << 10)
    parts = placement.push_parts(200 << 10)
    assert sorted(name for _, names in parts for name in names) == sorted(s.name for s in placement.shards)
    for ps, names in parts:
        assert all(placement.shards[[s.name for s in placement.shards].index(n)].ps == ps for n in names)
        assert len(names) == 1 or sum(s.nbytes for s in placement.shards if s.name in names) <= 200 << 10
    assert len(parts) < len(placement.shards)  # the small shards travel together
    assert placement.push_parts(None) == tuple((ps, tuple(s.name for s in placement.on_ps(ps))) for ps in range(2))


def test_push_parts_take_turns_across_ps_starting_at_first_ps_and_keep_each_ps_in_order():
    placement = place_variables({"w": np.zeros((784, 256), np.float32)}, num_ps=2, part_bytes=256 << 10)
    per_ps = {ps: [n for p, names in placement.push_parts(256 << 10) if p == ps for n in names] for ps in (0, 1)}
    assert all(len(names) == 2 for names in per_ps.values())  # 784 KiB: 4 shards, 2 per ps
    for first in (0, 1, 2, 3):
        parts = placement.push_parts(256 << 10, first_ps=first)
        assert [ps for ps, _ in parts] == ([0, 1, 0, 1] if first % 2 == 0 else [1, 0, 1, 0])
        for ps in (0, 1):  # each ps still gets its parts in shard order
            assert [n for p, names in parts if p == ps for n in names] == per_ps[ps]


def test_push_parts_of_ps_with_fewer_parts_drop_out_of_the_turns():
    variables = {"w": np.zeros((784, 256), np.float32), "b": np.zeros(10, np.float32)}
    placement = place_variables(variables, num_ps=3, strategy=PlacementStrategy.ROUND_ROBIN, part_bytes=256 << 10)
    from_ps0 = placement.push_parts(256 << 10)
    parts = placement.push_parts(256 << 10, first_ps=2)
    assert [ps for ps, _ in parts] == [2, 0, 1, 0]  # ps 0 has 2 parts, the others 1
    assert sorted(parts) == sorted(from_ps0)
    assert sorted(n for _, names in parts for n in names) == sorted(s.name for s in placement.shards)


def test_a_part_size_below_one_byte_is_refused_naming_it():
    with pytest.raises(TrainError, match="push part size 0"):
        place_variables({"w": np.zeros(3)}, num_ps=1, part_bytes=0)


def test_shard_homes_counts_each_ps_shards_and_names_the_ps_holding_none():
    from shoal.train.placement_history import shard_homes
    variables = {"w": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    placement = place_variables(variables, num_ps=3, strategy=PlacementStrategy.ROUND_ROBIN)
    ids = [0, 2, 5]  # ps 1 of the cluster was re-homed: the client's ps 1 is the cluster's ps:2
    assert shard_homes(placement, ids.__getitem__) == "ps:0 (1 shard), ps:2 (1 shard); ps:5 holds none"
    one_ps = place_variables(variables, num_ps=3, strategy=PlacementStrategy.GREEDY, request_cost_bytes=1 << 20)
    assert shard_homes(one_ps, ids.__getitem__) == "ps:0 (2 shards); ps:2, ps:5 hold none"
