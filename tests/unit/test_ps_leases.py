"""The lease op and push accounting in the ps service (no socket), and their wire types."""

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.leases import LeaseBook, LeaseError
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import (ASYNC, DoneRequest, FailedRequest, InitRequest, LeaseReply, LeaseRequest, LeaseState,
                               Mode, ProtocolFieldError, PushOutcome, PushRequest, ReadyRequest, SnapshotReply,
                               SnapshotRequest, StatusReply, StatusRequest, TrainingMode, UsedPositions)
from shoal.ps.service import PsService
from tests.unit.test_ps_service import request

SYNC2 = TrainingMode(Mode.SYNC, 2)


def make_service(task="ps:0", training=ASYNC, leases=None):
    service = PsService(task, 2, lambda reason: None)
    service.handle(request(InitRequest(SGD(1.0).to_config(), training, leases=leases), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    return service


def lease(service, task="worker:0", count=10, n=100, seed=0, holder="h"):
    (reply,) = service.handle(request(LeaseRequest(task, holder, n, seed, count)))
    return LeaseReply.decode(reply.body.fields())


def push(service, task, step, reply=None, start=None, end=None):
    used = None if reply is None else UsedPositions(reply.book, ((reply.lease, start if start is not None else reply.start,
                                                                  end if end is not None else reply.end),))
    return service.handle(request(PushRequest(task, step, used=used), {"w": np.ones(3, np.float32)}))


def counts(service):
    (reply,) = service.handle(request(StatusRequest()))
    return StatusReply.decode(reply.body.fields()).leases


def test_push_without_used_sends_the_same_header_as_before():
    assert PushRequest("worker:0", 3).fields() == {"task": "worker:0", "step": 3, "pull": True, "ends_step": True}
    assert PushRequest.decode({"task": "worker:0", "step": 3}).used is None


def test_push_used_round_trips_and_bad_ranges_are_refused_naming_them():
    used = UsedPositions("abc", ((1, 0, 10), (2, 10, 20)))
    assert PushRequest.decode(PushRequest("worker:0", 0, used=used).fields()).used == used
    for bad in ({"book": "abc", "ranges": [[1, 5, 5]]}, {"book": "abc", "ranges": []}, {"ranges": [[1, 0, 1]]},
                {"book": "abc", "ranges": [[1, -1, 3]]}, {"book": "abc", "ranges": [[1, 0, 2]] * 257}):
        with pytest.raises(ProtocolFieldError, match="push request: field 'used' must be"):
            PushRequest.decode({"task": "worker:0", "step": 0, "used": bad})


def test_status_without_leases_reads_as_none():
    service = make_service()
    assert counts(service) is None


def test_only_ps_0_serves_leases():
    with pytest.raises(PsError, match="ps:1 does not serve leases; ask ps:0"):
        lease(make_service("ps:1"))


def test_lease_for_another_data_set_is_refused_naming_both():
    service = make_service()
    lease(service, n=100, seed=0)
    with pytest.raises(LeaseError, match="100 examples with seed 3, but this job's is 100 examples with seed 0"):
        lease(service, "worker:1", n=100, seed=3)


def test_async_applied_push_consumes_its_positions():
    service = make_service()
    reply = lease(service, count=100)
    push(service, "worker:0", 0, reply, 0, 60)
    assert counts(service).consumed == 60 and counts(service).leased == 40
    push(service, "worker:0", 1, reply, 60, 100)
    c = counts(service)
    assert (c.epoch, c.completed, c.consumed) == (1, 1, 0)


def test_push_with_bad_positions_is_refused_before_it_is_applied():
    service = make_service()
    reply = lease(service, count=10)
    with pytest.raises(LeaseError, match=r"\[0, 20\) of lease 1 .* outside it"):
        push(service, "worker:0", 0, reply, 0, 20)
    (status,) = service.handle(request(StatusRequest()))
    assert status.body.step == 0  # the gradient was not applied


def test_sync_positions_are_pending_until_the_step_is_applied_and_stale_ones_requeued():
    service = make_service(training=SYNC2)
    a, b = lease(service, "worker:0", 10), lease(service, "worker:1", 10)
    assert push(service, "worker:0", 0, a) == []  # accumulated: waits for worker:1
    assert counts(service).pending == 10 and counts(service).consumed == 0
    push(service, "worker:1", 0, b)
    assert counts(service).consumed == 20 and counts(service).pending == 0
    c = lease(service, "worker:0", 10)
    (stale,) = push(service, "worker:0", 0, c)  # computed at step 0, the ps is at 1
    assert stale.body.outcome is PushOutcome.STALE
    assert counts(service).requeued == 10 and counts(service).consumed == 20


def test_done_and_failed_give_a_workers_leases_back():
    service = make_service()
    lease(service, "worker:0", 30)
    lease(service, "worker:1", 20)
    service.handle(request(DoneRequest("worker:0")))
    service.handle(request(FailedRequest("worker:1")))
    c = counts(service)
    assert (c.leased, c.requeued) == (0, 50)


def test_snapshot_carries_the_book_and_init_restores_it_on_ps_0():
    service = make_service()
    reply = lease(service, count=40)
    push(service, "worker:0", 0, reply, 0, 25)
    (snap,) = service.handle(request(SnapshotRequest()))
    state = SnapshotReply.decode(snap.body.fields()).leases
    restored = make_service(leases=state)
    c = counts(restored)
    assert (c.epoch, c.consumed, c.leased) == (0, 25, 0)
    again = lease(restored, "worker:0", 100)
    assert (again.start, again.end) == (25, 100)
    assert counts(make_service("ps:1", leases=state)) is None  # only ps 0 keeps the book


def test_positions_of_a_lease_from_before_a_restart_are_counted_lost():
    old = make_service()
    reply = lease(old, count=10)
    service = make_service(leases=None)
    lease(service, "worker:1", 5)
    (answer,) = push(service, "worker:0", 0, reply)
    assert answer.body.outcome is PushOutcome.APPLIED
    assert counts(service).lost == 10 and counts(service).consumed == 0


def test_lease_reply_decode_checks_a_granted_range():
    with pytest.raises(ProtocolFieldError, match="lease reply: field 'end' must be greater than start"):
        LeaseReply.decode(LeaseReply(LeaseState.GRANTED, "b", 1, 0, 5, 5).fields())


def test_init_with_a_damaged_lease_state_changes_nothing_and_a_retry_restores_the_book():
    service = PsService("ps:0", 2, lambda reason: None)
    good = {"version": 1, "num_examples": 100, "seed": 0, "next_epoch": 1, "completed": 0, "requeued": 0,
            "lost": 0, "epochs": [{"epoch": 0, "consumed": [[0, 25]], "requeued": 0, "lost": 0}]}
    damaged = dict(good, epochs=[{"epoch": 0, "consumed": [[5, 3]], "requeued": 0, "lost": 0}])
    with pytest.raises(LeaseError, match=r"bad consumed range \[5, 3\]"):
        service.handle(request(InitRequest(SGD(1.0).to_config(), ASYNC, leases=damaged), {"w": np.zeros(3, np.float32)}))
    assert service.phase.value == "empty" and len(service.store) == 0  # not half-initialized
    service.handle(request(InitRequest(SGD(1.0).to_config(), ASYNC, leases=good), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    assert counts(service).consumed == 25  # the retried init restored the book


class CountingBook(LeaseBook):
    """A real lease book that counts how often a push's positions are checked."""

    checks = 0

    def sort(self, *args, **kwargs):
        CountingBook.checks += 1
        return super().sort(*args, **kwargs)


@pytest.mark.parametrize("training", [ASYNC, SYNC2])
def test_a_push_checks_its_used_positions_once(monkeypatch, training):
    monkeypatch.setattr("shoal.ps.lease_desk.LeaseBook", CountingBook)
    service = make_service(training=training)
    reply = lease(service)
    CountingBook.checks = 0
    push(service, "worker:0", 0, reply)
    assert CountingBook.checks == 1
    c = counts(service)
    assert (c.consumed, c.pending) == ((10, 0) if training is ASYNC else (0, 10))


def test_a_push_answered_moved_on_ps0_still_counts_its_used_positions():
    """ps 0's last push part held only shards that moved to a ps that joined: answered MOVED,
    the part goes to the new ps without `used` (ps 0 gets no part again), so ps 0 counts the
    positions now, as applied; they are neither left leased nor requeued and trained twice."""
    from shoal.ps.protocol import ReleaseRequest

    service = make_service()
    reply = lease(service, count=100)
    service.handle(request(ReleaseRequest(("w",), 1)))
    (moved,) = push(service, "worker:0", 0, reply, 0, 60)
    assert moved.body.outcome is PushOutcome.MOVED
    assert counts(service).consumed == 60 and counts(service).leased == 40
