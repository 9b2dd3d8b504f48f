"""`DistributedSampler`: a DataLoader sampler that reads this replica's shard of the data."""

from __future__ import annotations

from typing import Iterator, Sized

import numpy as np
import torch.utils.data

from shoal.torch.job import Job
from shoal.train.data import epoch_order, shard_indices


class DistributedSampler(torch.utils.data.Sampler[int]):
    """The indices of this replica's shard of `dataset`, in a new order every epoch.

        loader = DataLoader(data, batch_size=100, sampler=shoal.torch.DistributedSampler(data, job))

    The job's sharding (shoal/train/data.py, as `ShardedBatches`): the examples are permuted once
    from `seed`, the same on every task, and dealt out to the job's replicas, so shards are
    disjoint. Every shard has the same length (the permutation is extended by its beginning to a
    multiple of the replicas), so in sync mode every replica runs the same number of steps per
    epoch. With `shuffle`, each epoch reads the shard in another order, the same on every run;
    without, in index order.

    Unlike torch's DistributedSampler, the epoch moves on by itself each time the DataLoader
    starts a pass; `set_epoch(n)` still sets it for the next pass. Not thread-safe.
    """

    def __init__(self, dataset: Sized, job: Job, *, shuffle: bool = True, seed: int = 0):
        self.shard = shard_indices(len(dataset), job.num_replicas, job.replica_index, seed, equal=True)
        self.shuffle = shuffle
        self.seed = seed
        self.replica_index = job.replica_index
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.shard)

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.shard, self.seed, self.replica_index, self.epoch) if self.shuffle else np.sort(self.shard)
        self.epoch += 1
        return iter(order.tolist())

    def set_epoch(self, epoch: int) -> None:
        """Read the shard in epoch `epoch`'s order at the next pass."""
        self.epoch = epoch
