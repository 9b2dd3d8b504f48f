"""`LeasedBatchSampler`: whole batches of leased example indices, as index tensors (dynamic
sharding at a batch's cost rather than an example's)."""

from __future__ import annotations

from typing import Iterator, Sized

import numpy as np
import torch.utils.data

from shoal.torch.errors import TorchTrainError
from shoal.torch.job import Job
from shoal.train.leased_data import default_lease_size


class LeasedBatchSampler(torch.utils.data.Sampler[torch.Tensor]):
    """Batches of example indices leased from ps 0, each a sorted int64 tensor, for a
    DataLoader over a dataset that takes an index tensor (a `TensorDataset`):

        batches = shoal.torch.LeasedBatchSampler(train, job, batch_size=100)
        loader = DataLoader(train, batch_size=None, sampler=batches)

    The same leases as `LeasedSampler` under a `BatchSampler` (docs/dynamic-sharding.md), and
    `step()` reports the same positions, but a batch is cut out of a lease in one piece and
    gathered with one tensor index: about a quarter less CPU per batch of 100 MNIST images than
    100 ints through a BatchSampler and a list index (bench/README.md, "Batch assembly"). Indices
    are sorted within a batch (rows read in memory order; a batch's mean gradient does not
    depend on its order). For a dataset read one example at a time, use `LeasedSampler`.

    Iterate it only after `shoal.torch.DistributedOptimizer(..., job)` is created, with
    `num_workers=0` (the DataLoader's default: no read-ahead, so the positions handed out since
    the last step are the ones its gradient used). Every worker must pass the same data set and
    `seed`. One pass runs `epochs` epochs of the job (None: no end; stop by steps); with
    `epochs`, the last batch may be short. `lease_size` positions per request to ps 0 (None:
    `default_lease_size`, 32 batches, at most a 16th of the data set). Blocks on ps 0 while
    leasing; not thread-safe.
    """

    def __init__(self, dataset: Sized, job: Job, batch_size: int, *, seed: int = 0, lease_size: int | None = None,
                 epochs: int | None = None, shuffle: bool = True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise TorchTrainError(f"LeasedBatchSampler batch_size must be a positive integer, got {batch_size!r}")
        self.num_examples = len(dataset)
        self.job = job
        self.batch_size = batch_size
        self.seed = seed
        self.lease_size = lease_size if lease_size is not None else default_lease_size(self.num_examples, batch_size)
        self.epochs = epochs
        self.shuffle = shuffle

    def __iter__(self) -> Iterator[torch.Tensor]:
        link = self.job.leases
        if link.session is None:
            raise TorchTrainError(f"{self.job.task}: LeasedBatchSampler leases through the DistributedOptimizer's "
                                  "session; create shoal.torch.DistributedOptimizer(..., job) before iterating the "
                                  "DataLoader")
        stream = link.session.leased_batches(self.num_examples, 1, seed=self.seed, lease_size=self.lease_size,
                                             epochs=self.epochs, shuffle=self.shuffle,
                                             after_idle_step=link.values_changed)
        pieces: list[np.ndarray] = []  # the batch being assembled, when it spans leases
        wanted = self.batch_size
        while True:
            # with none free, a short batch (the pass ends) rather than a wait that this very
            # step's push may be holding up: the positions handed out for it are in hand
            run = stream.take_lease(in_hand=link.handed)
            if run is None and self.epochs is None:
                run = stream.take_lease()  # no end: wait for a position (LeaseWaitError in time), never end early
            if run is None:
                break
            link.begin_run(run)
            indices, at = run.indices, 0
            while at < len(indices):
                take = min(wanted, len(indices) - at)
                pieces.append(indices[at:at + take])
                link.hand(take)
                at += take
                wanted -= take
                if wanted == 0:
                    yield _sorted_tensor(pieces)
                    pieces, wanted = [], self.batch_size
        if pieces:
            yield _sorted_tensor(pieces)


def _sorted_tensor(pieces: list[np.ndarray]) -> torch.Tensor:
    """The indices of `pieces`, sorted, as a new int64 tensor."""
    joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return torch.from_numpy(np.sort(joined).astype(np.int64, copy=False))
