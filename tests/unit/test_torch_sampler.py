"""DistributedSampler: the job's sharding for a DataLoader, equal shards, a new order per epoch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId  # noqa: E402
from shoal.torch.job import Job  # noqa: E402
from shoal.torch.sampler import DistributedSampler  # noqa: E402
from shoal.train import ShardedBatches  # noqa: E402
from shoal.wire import JobSecret  # noqa: E402

SPEC = ClusterSpec.from_dict({"ps": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


def job(replica: int) -> Job:
    task = TaskId("chief", 0) if replica == 0 else TaskId("worker", replica - 1)
    return Job(ClusterConfig(SPEC, task), JobSecret(b"s", "test"), {})


def test_replicas_get_equal_disjoint_shards_that_cover_the_data():
    samplers = [DistributedSampler(range(1000), job(r), seed=3) for r in range(3)]
    assert [len(s) for s in samplers] == [334] * 3  # 1000 padded to 1002 with 2 repeated examples
    seen = np.concatenate([list(s) for s in samplers])
    assert set(seen) == set(range(1000)) and len(seen) - len(np.unique(seen)) == 2


def test_shards_are_the_job_sharding_of_sharded_batches():
    sampler = DistributedSampler(range(999), job(1), seed=5)
    np.testing.assert_array_equal(np.sort(sampler.shard), np.sort(ShardedBatches(999, 10, 3, 1, seed=5).shard))


def test_each_pass_reads_the_shard_in_a_new_order_and_set_epoch_replays_one():
    sampler = DistributedSampler(range(100), job(0))
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) and first != second
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert list(DistributedSampler(range(100), job(0), shuffle=False)) == sorted(first)


def test_data_loader_batches_come_from_the_shard():
    data = torch.utils.data.TensorDataset(torch.arange(50))
    sampler = DistributedSampler(data, job(2))
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    (values,) = zip(*loader)
    assert sorted(torch.cat(values).tolist()) == sorted(sampler.shard.tolist())
