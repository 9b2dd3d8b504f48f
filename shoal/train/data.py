"""Data sharding: each replica reads a disjoint shard, reshuffled every epoch."""

from __future__ import annotations

import numpy as np

from shoal.train.errors import TrainError


class ShardedBatches:
    """An endless iterator of index batches over this replica's shard of `num_examples`.

    The examples are split once (the same permutation on every task, from `seed`) into
    `num_shards` disjoint shards; each epoch this replica reshuffles its own shard, so two
    workers never repeat each other's work. Not thread-safe.
    """

    def __init__(self, num_examples: int, batch_size: int, num_shards: int, shard_index: int, seed: int = 0):
        if not 0 <= shard_index < num_shards:
            raise TrainError(f"shard_index {shard_index} is out of range for {num_shards} shards")
        self.shard = np.random.default_rng(seed).permutation(num_examples)[shard_index::num_shards]
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
            rng = np.random.default_rng([self.seed, self.shard_index, self.epoch])
            self._order = rng.permutation(self.shard)
            self._pos = 0
        batch = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch
