import numpy as np
import pytest

from shoal.ps import Adagrad, Adam, Momentum, PsError, SGD, rule_from_config
from shoal.ps.protocol import PushOutcome
from shoal.ps.sync import SyncAggregator
from shoal.train import ShardedBatches, TrainError


def test_aggregator_averages_distinct_replicas_then_advances():
    agg = SyncAggregator(replicas=2)
    assert agg.add("worker:0", 0, {"w": np.array([1.0, 2.0])}) is PushOutcome.ACCUMULATED
    assert agg.add("worker:0", 0, {"w": np.array([9.0, 9.0])}) is PushOutcome.DUPLICATE
    assert agg.add("worker:1", 0, {"w": np.array([3.0, 6.0])}) is PushOutcome.APPLIED
    np.testing.assert_array_equal(agg.take({"w"})["w"], [2.0, 4.0])
    assert agg.step == 1


def test_aggregator_drops_gradients_from_old_steps():
    agg = SyncAggregator(replicas=1, step=5)
    assert agg.add("worker:2", 4, {"w": np.ones(2)}) is PushOutcome.STALE
    assert agg.waiting_for == 1


def test_aggregator_does_not_alias_the_first_gradient():
    agg = SyncAggregator(replicas=2)
    first = np.ones(3)
    agg.add("a", 0, {"w": first})
    agg.add("b", 0, {"w": np.ones(3)})
    agg.take({"w"})
    np.testing.assert_array_equal(first, np.ones(3))


@pytest.mark.parametrize("rule", [SGD(0.1), Momentum(0.1, 0.5, nesterov=True), Adam(0.01), Adagrad(0.2)])
def test_rule_config_roundtrips(rule):
    assert rule_from_config(rule.to_config()) == rule


def test_momentum_follows_tensorflow_formula():
    rule, param = Momentum(0.1, 0.9), np.array([1.0])
    state = rule.init_state(param)
    rule.apply(param, np.array([1.0]), state)
    rule.apply(param, np.array([1.0]), state)
    np.testing.assert_allclose(param, 1.0 - 0.1 * 1.0 - 0.1 * 1.9)


@pytest.mark.parametrize("config, match", [
    ({"name": "rmsprop"}, "unknown optimizer 'rmsprop'"),
    ({"name": "sgd", "learning_rate": "fast"}, "must be a finite float"),
    ({"name": "sgd", "learning_rate": float("nan")}, "must be a finite float"),
    ({"name": "sgd", "momentum": 0.9}, "has no field"),
    ("sgd", "must be a map"),
])
def test_bad_rule_config_is_refused(config, match):
    with pytest.raises(PsError, match=match):
        rule_from_config(config)


def test_shards_are_disjoint_and_cover_the_data():
    shards = [ShardedBatches(1000, 10, 3, i, seed=4).shard for i in range(3)]
    joined = np.concatenate(shards)
    assert len(joined) == 1000 and len(np.unique(joined)) == 1000


def test_each_epoch_reshuffles_the_shard():
    batches = ShardedBatches(100, 10, 2, 1, seed=0)
    epoch0 = np.concatenate([next(batches) for _ in range(5)])
    epoch1 = np.concatenate([next(batches) for _ in range(5)])
    assert sorted(epoch0) == sorted(epoch1) and not np.array_equal(epoch0, epoch1)
    assert batches.epoch == 1


def test_batch_larger_than_shard_is_a_clear_error():
    with pytest.raises(TrainError, match="batch_size 600 does not fit"):
        ShardedBatches(1000, 600, 2, 0)


def test_aggregator_applies_each_shard_when_every_replica_pushed_it_and_ends_the_step_with_the_last():
    agg = SyncAggregator(replicas=2)
    shards = {"a", "b"}
    assert agg.add("w0", 0, {"a": np.ones(2)}) is PushOutcome.ACCUMULATED
    assert agg.add("w1", 0, {"a": np.full(2, 3.0)}) is PushOutcome.APPLIED
    ready = agg.take(shards)
    np.testing.assert_array_equal(ready["a"], [2.0, 2.0])
    assert agg.step == 0 and agg.applied({"a"}, 0) and not agg.applied({"a", "b"}, 0)
    assert agg.add("w2", 0, {"a": np.ones(2)}) is PushOutcome.STALE  # a backup's part after the shard was applied
    agg.add("w0", 0, {"b": np.ones(1)})
    agg.add("w1", 0, {"b": np.ones(1)})
    assert set(agg.take(shards)) == {"b"}
    assert agg.step == 1 and agg.applied({"a", "b"}, 0) and not agg.applied({"a"}, 1)
