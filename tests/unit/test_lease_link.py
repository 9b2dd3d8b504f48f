"""The positions a LeasedSampler reports for a step are exactly the examples of that step's
batch, also when a batch spans two leases and a lease spans several batches (the sampler hands
a lease out one example at a time and the link cuts each step's share out of it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler  # noqa: E402

from shoal.ps.lease_desk import LeaseDesk  # noqa: E402
from shoal.ps.protocol import PushOutcome, PushRequest, UsedPositions  # noqa: E402
from shoal.torch.leased_sampler import LeasedSampler  # noqa: E402
from shoal.train.leased_data import LeasedBatch  # noqa: E402
from tests.unit.test_leased_sampler_starvation import FakeJob, Session  # noqa: E402


def positions(used):
    return [p for _, start, end in used.ranges for p in range(start, end)]


@pytest.mark.parametrize("batch_size, lease_size", [(32, 50), (32, 1024), (7, 3), (50, 50)])
def test_each_step_reports_exactly_the_positions_of_its_batch(batch_size, lease_size):
    desk = LeaseDesk("ps:0", "book-1")
    job = FakeJob("worker:0")
    job.leases.attach(Session(desk, job.task))
    loader = iter(BatchSampler(LeasedSampler(range(5000), job, lease_size=lease_size, shuffle=False), batch_size,
                               drop_last=False))
    seen = []
    for step in range(60):
        batch = next(loader)
        assert job.leases.handed == batch_size
        used = job.leases.take_used()
        assert positions(used) == batch  # shuffle=False: an example's index is its position
        assert job.leases.handed == 0
        desk.account(PushRequest(job.task, step, used=used), PushOutcome.APPLIED, None)
        seen += batch
    assert seen == list(range(60 * batch_size))
    assert job.leases.take_used() is None  # nothing handed since


def test_part_cuts_a_batch_of_several_ranges_at_any_offsets():
    batch = LeasedBatch(list(range(10)), UsedPositions("b", ((1, 100, 104), (2, 0, 6))), 0)
    assert batch.part(2, 7).used.ranges == ((1, 102, 104), (2, 0, 3))
    assert batch.part(4, 10).used.ranges == ((2, 0, 6),)
    assert batch.part(0, 3).used.ranges == ((1, 100, 103),)
    assert list(batch.part(2, 7).indices) == [2, 3, 4, 5, 6]
