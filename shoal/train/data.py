"""Data sharding: each replica reads a disjoint shard, reshuffled every epoch.

`shard_indices` and `epoch_order` are the job's sharding, shared by `ShardedBatches` (numpy
programs) and `shoal.torch.DistributedSampler` (PyTorch DataLoaders). Pure functions of their
arguments, so every task computes its own shard with no coordination.
"""

from __future__ import annotations

import numpy as np

from shoal.train.errors import TrainError


def shard_indices(num_examples: int, num_shards: int, shard_index: int, seed: int = 0,
                  equal: bool = False) -> np.ndarray:
    """The example indices of shard `shard_index`: the examples are permuted once (the same
    permutation on every task, from `seed`) and dealt out to `num_shards` shards, so shards are
    disjoint and together cover every example. With `equal`, the permutation is first extended
    by its own beginning to a multiple of `num_shards`, so every shard has the same length
    (a few examples then appear in two shards), as synchronous training needs when every
    replica runs whole epochs."""
    if not 0 <= shard_index < num_shards:
        raise TrainError(f"shard_index {shard_index} is out of range for {num_shards} shards")
    order = np.random.default_rng(seed).permutation(num_examples)
    if equal and num_examples % num_shards:
        order = np.resize(order, -(-num_examples // num_shards) * num_shards)  # np.resize repeats from the start
    return order[shard_index::num_shards]


def epoch_order(shard: np.ndarray, seed: int, shard_index: int, epoch: int) -> np.ndarray:
    """`shard` reshuffled for `epoch`: a different order every epoch, the same on every run."""
    return np.random.default_rng([seed, shard_index, epoch]).permutation(shard)


class ShardedBatches:
    """An endless iterator of index batches over this replica's shard of `num_examples`.

    The examples are split once (the same permutation on every task, from `seed`) into
    `num_shards` disjoint shards; each epoch this replica reshuffles its own shard, so two
    workers never repeat each other's work. Not thread-safe.
    """

    def __init__(self, num_examples: int, batch_size: int, num_shards: int, shard_index: int, seed: int = 0):
        self.shard = shard_indices(num_examples, num_shards, shard_index, seed)
        if batch_size < 1 or batch_size > len(self.shard):
            raise TrainError(f"batch_size {batch_size} does not fit this replica's shard of {len(self.shard)} "
                             f"examples ({num_examples} examples / {num_shards} replicas); use a smaller batch")
        self.batch_size = batch_size
        self.seed = seed
        self.shard_index = shard_index
        self.epoch = -1
        self._order = np.empty(0, dtype=np.int64)
        self._pos = 0

    def __iter__(self) -> "ShardedBatches":
        return self

    def __next__(self) -> np.ndarray:
        if self._pos + self.batch_size > len(self._order):
            self.epoch += 1
            self._order = epoch_order(self.shard, self.seed, self.shard_index, self.epoch)
            self._pos = 0
        batch = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch
