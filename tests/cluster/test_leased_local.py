"""Leased batches through a real ps (in this process, on a loopback socket): an epoch is covered
exactly once, by numpy sessions and by torch's LeasedSampler and LeasedBatchSampler through
DistributedOptimizer.step()."""

import numpy as np
import pytest

import shoal


def test_leased_batches_cover_an_epoch_exactly_once_with_batches_across_leases():
    with shoal.create_local_server() as local:
        variables = {"w": np.zeros(3, np.float32)}
        with shoal.TrainingSession(local.config, variables, shoal.SGD(0.1), secret=local.secret) as session:
            batches = list(session.leased_batches(50, 7, lease_size=10, epochs=1, shuffle=False))
            assert session.ps.status(0, 5.0).leases.leased == 50  # handed out, none pushed yet: the iteration ended
            for batch in batches:
                session.push({"w": np.ones(3, np.float32)}, used=batch)
            leases = session.ps.status(0, 5.0).leases
    seen = np.concatenate([b.indices for b in batches])
    assert sorted(seen.tolist()) == list(range(50))
    assert [len(b) for b in batches] == [7] * 7 + [1]
    assert any(len(b.used.ranges) == 2 for b in batches)  # a batch spanning two leases
    assert (leases.completed, leases.epoch, leases.consumed) == (1, 1, 0)


@pytest.mark.parametrize("per_batch", [False, True], ids=["LeasedSampler", "LeasedBatchSampler"])
def test_leased_sampler_reports_each_steps_examples_through_the_optimizer(per_batch):
    torch = pytest.importorskip("torch")
    import shoal.torch
    from torch.utils.data import BatchSampler, DataLoader, TensorDataset

    job = shoal.torch.init()
    try:
        data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
        model = torch.nn.Linear(3, 1)
        opt = shoal.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job)
        if per_batch:
            batches = shoal.torch.LeasedBatchSampler(data, job, 8, lease_size=16, epochs=1)
        else:
            batches = BatchSampler(shoal.torch.LeasedSampler(data, job, lease_size=16, epochs=1), 8, drop_last=False)
        loader = DataLoader(data, batch_size=None, sampler=batches)
        steps = 0
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
        leases = opt.session.ps.status(0, 5.0).leases
        opt.finish()
    finally:
        job.close()
    assert steps == 5 and (leases.completed, leases.lost) == (1, 0)


def test_leased_sampler_before_the_optimizer_is_refused_with_the_fix():
    pytest.importorskip("torch")
    import shoal.torch
    from shoal.torch.errors import TorchTrainError

    job = shoal.torch.init()
    try:
        with pytest.raises(TorchTrainError, match=r"create shoal.torch.DistributedOptimizer\(\.\.\., job\) before"):
            next(iter(shoal.torch.LeasedSampler(range(10), job)))
    finally:
        job.close()
