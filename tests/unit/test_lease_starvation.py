"""No worker starves while its peers hold positions they have not used yet (dynamic sharding).

Workers in lockstep (sync training: a step needs every worker's gradient) lease through a real
`LeaseDesk` (ps 0's lease service, without a socket) with a real `LeasedBatches`, then report
their positions as a push would. A worker that found no position would wait, while its peers
wait for its gradient: `wait_timeout_s=0` turns that wait into a LeaseWaitError at once."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.ps.lease_desk import LeaseDesk
from shoal.ps.leases import LeaseBook
from shoal.ps.protocol import LeaseState, PushOutcome, PushRequest
from shoal.train.leased_data import LeasedBatches, LeaseWaitError, merge_used


class DeskClient:
    """What LeasedBatches needs of a PsClient: `lease`, answered by ps 0's desk in-process."""

    def __init__(self, desk: LeaseDesk):
        self.desk = desk

    def lease(self, request):
        return self.desk.lease(request)


def streams(desk, workers, n, batch, **kw):
    return {f"worker:{i}": LeasedBatches(DeskClient(desk), f"worker:{i}", f"h{i}", n, batch, wait_timeout_s=0.0,
                                         sleep=lambda s: None, **kw) for i in range(workers)}


def run_sync_lockstep(n, batch, workers, steps):
    """`steps` sync steps of `workers` workers taking a batch each; returns the desk."""
    desk = LeaseDesk("ps:0", "book-1")
    per_task = streams(desk, workers, n, batch)
    for step in range(steps):
        for task, stream in per_task.items():
            b = next(stream)
            assert len(b) >= 1
            desk.account(PushRequest(task, step, used=b.used), PushOutcome.ACCUMULATED, step)
        desk.step_reached(step + 1)
    return desk


@pytest.mark.parametrize("n, batch, workers, steps", [
    (1000, 100, 3, 40),      # starved at step 4 before
    (1797, 32, 6, 120),      # starved at step 24 before
    (10000, 64, 16, 400),    # starved at step 200 before
])
def test_sync_lockstep_never_starves_a_worker_when_peers_hold_unused_leases(n, batch, workers, steps):
    desk = run_sync_lockstep(n, batch, workers, steps)  # every worker got a batch every step
    assert desk.book.completed >= (steps * workers * batch) // n - 2
    assert len(desk.book._open) <= desk.book.max_open_epochs


def take_sampler_batch(stream, batch):
    """What LeasedSampler under a BatchSampler does for one batch: one position at a time,
    counting the positions already handed out for this step as in hand."""
    got = []
    for _ in range(batch):
        b = stream.take(1, in_hand=len(got))
        if b is None:
            break
        got.append(b)
    return got


@pytest.mark.parametrize("outcome", [PushOutcome.ACCUMULATED, PushOutcome.APPLIED])
def test_position_at_a_time_sampler_never_starves_at_default_lease_size(outcome):
    desk = LeaseDesk("ps:0", "book-1")
    per_task = streams(desk, 3, 1797, 1, lease_size=1024)  # LeasedSampler's defaults, digits-sized data
    for step in range(400):
        for task, stream in per_task.items():
            got = take_sampler_batch(stream, 32)
            assert got, f"{task}'s sampler ended at step {step} although epochs=None"
            sync_step = step if outcome is PushOutcome.ACCUMULATED else None
            desk.account(PushRequest(task, step, used=merge_used(got)), outcome, sync_step)
        desk.step_reached(step + 1)
    assert desk.book.completed >= 400 * 3 * 32 // 1797 - 2


def test_worker_holding_every_position_out_fails_loudly_without_an_end():
    book = LeaseBook("b", 10, 0, max_open_epochs=1)
    desk = LeaseDesk("ps:0", "b")
    desk.book = book
    (stream,) = streams(desk, 1, 10, 10).values()
    held = next(stream)  # all of epoch 0, never pushed
    assert len(held) == 10
    with pytest.raises(LeaseWaitError, match="worker:0 itself"):
        next(stream)  # epochs=None: ending here would end training silently


def test_lease_waits_only_when_max_open_epochs_are_open():
    book = LeaseBook("b", 10, 0, max_open_epochs=3)
    for epoch in range(3):
        g = book.lease("worker:0", "h", 10)
        assert (g.state, g.lease.epoch) == (LeaseState.GRANTED, epoch)
    g = book.lease("worker:1", "h", 10)
    assert g.state is LeaseState.WAIT and g.held_by == ("worker:0",)


def test_batch_from_one_lease_names_its_positions_and_leaves_the_epoch_order_intact():
    desk = LeaseDesk("ps:0", "book-1")
    stream = streams(desk, 1, 50, 10, lease_size=30)["worker:0"]
    first = next(stream)
    lease, start, end = first.used.ranges[0]
    assert len(first.used.ranges) == 1 and end - start == 10
    order = stream._order(first.epoch)
    np.testing.assert_array_equal(first.indices, order[start:end])
    first.indices[:] = -1  # the caller owns its batch: the next batches still read the true order
    second = next(stream)
    assert second.used.ranges[0][1] == end and (second.indices >= 0).all()
    np.testing.assert_array_equal(stream._order(first.epoch)[start:end], order[start:end])
    assert (order >= 0).all()


def test_epochs_that_complete_several_a_second_get_one_info_line_per_ten_seconds(caplog):
    """The first epoch's line and one every EPOCH_LINE_EVERY_S after, saying how many completed
    between; a small model completes epochs faster than a terminal should scroll."""
    import logging

    from shoal.ps.lease_desk import EPOCH_LINE_EVERY_S

    clock = [0.0]
    desk = LeaseDesk("ps:0", "book-1", clock=lambda: clock[0])
    [stream] = streams(desk, 1, 100, 50).values()
    caplog.set_level(logging.INFO, logger="shoal.ps.service")
    step = 0
    while desk.book is None or desk.book.completed < 30:  # 2 batches an epoch; an epoch each 0.5 s
        b = next(stream)
        desk.account(PushRequest("worker:0", step, used=b.used), PushOutcome.APPLIED, None)  # async
        step += 1
        clock[0] += 0.25
    lines = [r.getMessage() for r in caplog.records if "complete:" in r.getMessage() and r.levelno == logging.INFO]
    assert lines[0] == "ps:0: epoch 0 complete: 100 positions consumed exactly once, 0 requeued, 0 lost"
    assert len(lines) == 1 + int(30 * 0.5 // EPOCH_LINE_EVERY_S), lines
    assert lines[1].startswith("ps:0: epoch 20 complete:") and lines[1].endswith(
        "0 lost (19 more complete since the last line, each exactly once)"), lines
