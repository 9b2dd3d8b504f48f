"""`LeasedSampler`: a DataLoader sampler whose indices are leased from ps 0 (dynamic sharding)."""

from __future__ import annotations

from typing import Iterator, Sized

import torch.utils.data

from shoal.torch.errors import TorchTrainError
from shoal.torch.job import Job
from shoal.train.leased_data import default_lease_size


class LeasedSampler(torch.utils.data.Sampler[int]):
    """Example indices leased from ps 0, so that workers share each epoch dynamically: a worker
    takes the next free positions when it needs them, and the positions of a worker that left go
    to the others (docs/dynamic-sharding.md).

        batches = BatchSampler(shoal.torch.LeasedSampler(data, job), batch_size=100, drop_last=False)
        loader = DataLoader(data, batch_size=None, sampler=batches)

    Iterate it only after `shoal.torch.DistributedOptimizer(..., job)` is created: it leases
    through that optimizer's session, and `step()` reports the positions handed out since the
    previous step as the ones its gradient used (exact when the DataLoader does not read ahead:
    `num_workers=0`, the default). Every worker must pass the same data set and `seed`. One pass
    runs `epochs` epochs of the job (None: no end; stop by steps), continuing the epoch a
    checkpoint saved; with `epochs`, a pass may end with a short batch at the very end, when no
    position is free and some are handed out for this step (waiting could hold up their push).
    `lease_size` positions per request to ps 0 (None: 1024, at most a 16th of the data set).
    Not thread-safe.
    """

    def __init__(self, dataset: Sized, job: Job, *, seed: int = 0, lease_size: int | None = None,
                 epochs: int | None = None, shuffle: bool = True):
        self.num_examples = len(dataset)
        self.job = job
        self.seed = seed
        self.lease_size = lease_size if lease_size is not None else default_lease_size(self.num_examples, 1, 1024)
        self.epochs = epochs
        self.shuffle = shuffle

    def __iter__(self) -> Iterator[int]:
        link = self.job.leases
        if link.session is None:
            raise TorchTrainError(f"{self.job.task}: LeasedSampler leases through the DistributedOptimizer's session; "
                                  "create shoal.torch.DistributedOptimizer(..., job) before iterating the DataLoader")
        stream = link.session.leased_batches(self.num_examples, 1, seed=self.seed, lease_size=self.lease_size,
                                             epochs=self.epochs, shuffle=self.shuffle,
                                             after_idle_step=link.values_changed)
        while True:
            # positions handed out for this step are in hand: with none free, a short batch (the
            # pass ends) rather than a wait that this very step's push may be holding up
            run = stream.take_lease(in_hand=link.handed)
            if run is None and self.epochs is None:
                run = stream.take_lease()  # no end: wait for a position (LeaseWaitError in time), never end early
            if run is None:
                return
            link.begin_run(run)
            for index in run.indices.tolist():  # one lease at a time: per example, one increment
                link.hand(1)
                yield index
