"""The positions a LeasedSampler or LeasedBatchSampler reports for a step are exactly the
examples of that step's batch, also when a batch spans two leases and a lease spans several
batches (the samplers hand a lease out one example or one batch at a time and the link cuts
each step's share out of it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler  # noqa: E402

from shoal.ps.lease_desk import LeaseDesk  # noqa: E402
from shoal.ps.protocol import PushOutcome, PushRequest, UsedPositions  # noqa: E402
from shoal.torch.errors import TorchTrainError  # noqa: E402
from shoal.torch.leased_batch_sampler import LeasedBatchSampler  # noqa: E402
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


@pytest.mark.parametrize("batch_size, lease_size", [(32, 50), (32, 1024), (7, 3), (50, 50)])
def test_a_leased_batch_is_one_sorted_index_tensor_of_exactly_the_positions_step_reports(batch_size, lease_size):
    desk = LeaseDesk("ps:0", "book-1")
    job = FakeJob("worker:0")
    job.leases.attach(Session(desk, job.task))
    loader = iter(LeasedBatchSampler(range(5000), job, batch_size, lease_size=lease_size, shuffle=False))
    seen = []
    for step in range(60):
        batch = next(loader)
        assert batch.dtype == torch.int64 and batch.shape == (batch_size,)
        assert job.leases.handed == batch_size
        used = job.leases.take_used()
        assert positions(used) == batch.tolist()  # shuffle=False: an example's index is its position
        desk.account(PushRequest(job.task, step, used=used), PushOutcome.APPLIED, None)
        seen += batch.tolist()
    assert seen == list(range(60 * batch_size))


def test_leased_batches_hold_the_examples_the_per_example_sampler_gives_sorted():
    batches = {}
    for name in ("per example", "per batch"):
        desk = LeaseDesk("ps:0", "book-1")
        job = FakeJob("worker:0")
        job.leases.attach(Session(desk, job.task))
        if name == "per example":
            loader = iter(BatchSampler(LeasedSampler(range(1797), job, lease_size=100, seed=3), 32, drop_last=False))
        else:
            loader = iter(LeasedBatchSampler(range(1797), job, 32, lease_size=100, seed=3))
        got = []
        for step in range(80):  # past the first epoch's end: 1797 = 56 x 32 + 5
            got.append(sorted(int(i) for i in next(loader)))
            desk.account(PushRequest(job.task, step, used=job.leases.take_used()), PushOutcome.APPLIED, None)
        batches[name] = got
    assert batches["per batch"] == batches["per example"]
    assert all(b == sorted(b) and len(b) == 32 for b in batches["per batch"])
    assert len({i for b in batches["per batch"][:56] for i in b}) == 56 * 32  # no example twice in an epoch


def test_a_pass_of_one_epoch_ends_with_a_short_batch():
    desk = LeaseDesk("ps:0", "book-1")
    job = FakeJob("worker:0")
    job.leases.attach(Session(desk, job.task))
    sizes = []
    for step, batch in enumerate(LeasedBatchSampler(range(1000), job, 64, lease_size=300, epochs=1)):
        sizes.append(len(batch))
        desk.account(PushRequest(job.task, step, used=job.leases.take_used()), PushOutcome.APPLIED, None)
    assert sizes == [64] * 15 + [40]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "100"])
def test_a_bad_batch_size_is_refused_by_name(bad):
    with pytest.raises(TorchTrainError, match=f"batch_size must be a positive integer, got {bad!r}"):
        LeasedBatchSampler(range(10), FakeJob("worker:0"), bad)


def test_iterating_before_the_optimizer_started_says_what_to_do():
    with pytest.raises(TorchTrainError, match="create shoal.torch.DistributedOptimizer"):
        next(iter(LeasedBatchSampler(range(10), FakeJob("worker:0"), 4)))
