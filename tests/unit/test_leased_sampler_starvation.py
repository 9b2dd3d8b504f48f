"""LeasedSampler under a BatchSampler, and LeasedBatchSampler, in lockstep: no worker's sampler
starves or ends early.

Three workers share a real LeaseDesk (ps 0's lease service, in-process); each step every worker
takes a batch from its DataLoader-style BatchSampler and reports the positions its sampler
handed out (`LeaseLink.take_used`, as `DistributedOptimizer.step` does)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler  # noqa: E402

from shoal.ps.lease_desk import LeaseDesk  # noqa: E402
from shoal.ps.protocol import PushOutcome, PushRequest  # noqa: E402
from shoal.torch.lease_link import LeaseLink  # noqa: E402
from shoal.torch.leased_batch_sampler import LeasedBatchSampler  # noqa: E402
from shoal.torch.leased_sampler import LeasedSampler  # noqa: E402
from shoal.train.leased_data import LeasedBatches  # noqa: E402
from tests.unit.test_lease_starvation import DeskClient  # noqa: E402


@dataclass
class Session:
    """The part of a TrainingSession a LeasedSampler uses, leasing from `desk` without waiting."""

    desk: LeaseDesk
    task: str

    def leased_batches(self, num_examples, batch_size, after_idle_step=None, **kw):  # (async: no idle steps)
        return LeasedBatches(DeskClient(self.desk), self.task, f"holder-{self.task}", num_examples, batch_size,
                             wait_timeout_s=0.0, sleep=lambda s: None, **kw)


@dataclass
class FakeJob:
    task: str
    leases: LeaseLink = field(default_factory=LeaseLink)


@pytest.mark.parametrize("per_batch", [False, True], ids=["LeasedSampler", "LeasedBatchSampler"])
@pytest.mark.parametrize("sync", [True, False])
def test_sampler_batches_keep_coming_in_lockstep_at_default_lease_size(sync, per_batch):
    desk = LeaseDesk("ps:0", "book-1")
    jobs = [FakeJob(f"worker:{i}") for i in range(3)]
    loaders = {}
    for job in jobs:
        job.leases.attach(Session(desk, job.task))
        loaders[job.task] = iter(LeasedBatchSampler(range(1797), job, 32) if per_batch
                                 else BatchSampler(LeasedSampler(range(1797), job), 32, drop_last=False))
    for step in range(200):  # starved (LeaseWaitError) at step 48 before
        for job in jobs:
            batch = next(loaders[job.task])
            assert len(batch) == 32
            used = job.leases.take_used()
            desk.account(PushRequest(job.task, step, used=used), PushOutcome.ACCUMULATED if sync else PushOutcome.APPLIED,
                         step if sync else None)
        desk.step_reached(step + 1)
    assert desk.book.completed >= 200 * 3 * 32 // 1797 - 2
