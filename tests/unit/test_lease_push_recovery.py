"""A push's `used` positions never turn a recoverable situation into a refused push.

Resent pushes, a member dropped for a missed heartbeat that is still alive, and a ps 0 rebuilt
without a lease book: the gradient's outcome is decided first (sync DUPLICATE, APPLIED), and the
positions are then counted as the book can (already reported: nothing; released or of another
book: lost). Malformed positions are still refused before anything is applied."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.ps.leases import LeaseError
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import (ASYNC, HeartbeatRequest, InitRequest, LeaseReply, LeaseRequest, Mode, PushOutcome,
                               PushRequest, ReadyRequest, StatusReply, StatusRequest, TrainingMode, UsedPositions)
from shoal.ps.service import PsService
from tests.unit.test_ps_service import request


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(training=ASYNC, clock=None, names=("chief:0", "worker:0")):
    service = PsService("ps:0", len(names), lambda reason: None, replica_names=names, clock=clock or Clock())
    service.handle(request(InitRequest(SGD(1.0).to_config(), training), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    return service


def lease(service, task="worker:0", count=10):
    (reply,) = service.handle(request(LeaseRequest(task, "h", 100, 0, count)))
    return LeaseReply.decode(reply.body.fields())


def used_of(reply, start=None, end=None):
    return UsedPositions(reply.book, ((reply.lease, reply.start if start is None else start,
                                       reply.end if end is None else end),))


def push(service, task, step, used):
    return service.handle(request(PushRequest(task, step, used=used), {"w": np.ones(3, np.float32)}))


def counts(service):
    (reply,) = service.handle(request(StatusRequest()))
    return StatusReply.decode(reply.body.fields()).leases


def test_resent_sync_push_is_duplicate_and_keeps_its_positions_pending():
    service = make(training=TrainingMode(Mode.SYNC, 2))
    reply = lease(service)
    assert push(service, "worker:0", 0, used_of(reply)) == []  # accumulated: waits for chief:0
    (again,) = push(service, "worker:0", 0, used_of(reply))  # resent after PeerLostError
    assert again.body.outcome is PushOutcome.DUPLICATE
    c = counts(service)
    assert (c.pending, c.requeued, c.lost) == (10, 0, 0)


def test_resent_async_push_is_applied_and_its_positions_counted_once():
    service = make()
    reply = lease(service)
    push(service, "worker:0", 0, used_of(reply))
    (again,) = push(service, "worker:0", 1, used_of(reply))
    assert again.body.outcome is PushOutcome.APPLIED
    c = counts(service)
    assert (c.consumed, c.requeued, c.lost) == (10, 0, 0)


def test_member_dropped_for_a_missed_heartbeat_has_its_push_applied_and_positions_lost():
    clock = Clock()
    service = make(clock=clock)
    for task in ("chief:0", "worker:0"):
        service.handle(request(HeartbeatRequest(task, "inc", 2000)))
    reply = lease(service)
    clock.now += 3
    service.handle(request(HeartbeatRequest("chief:0", "inc", 2000)))
    service.tick()  # worker:0 is LOST: its leases went back to the queue
    challenge = service.handle(request(HeartbeatRequest("worker:0", "inc", 2000)))[0].body.challenge
    service.handle(request(HeartbeatRequest("worker:0", "inc", 2000, answer=challenge)))  # alive: rejoins
    (answer,) = push(service, "worker:0", 0, used_of(reply))
    assert answer.body.outcome is PushOutcome.APPLIED
    c = counts(service)
    assert (c.lost, c.consumed, c.requeued) == (10, 0, 10)


def test_push_naming_an_old_book_to_a_ps_0_rebuilt_without_one_is_applied_and_lost():
    old = make()
    reply = lease(old)
    rebuilt = make()  # the restarted ps 0, rebuilt from the chief's copy without lease state
    (answer,) = push(rebuilt, "worker:0", 0, used_of(reply))
    assert answer.body.outcome is PushOutcome.APPLIED
    lease(rebuilt, "worker:1")  # the book, once declared, counts what was lost before it
    assert counts(rebuilt).lost == 10


@pytest.mark.parametrize("start, end, message", [
    (0, 20, r"\[0, 20\) of lease 1 .* outside it"),
    (0, 101, r"\[0, 101\).*<= 100"),
])
def test_malformed_positions_are_still_refused_before_the_push_counts(start, end, message):
    service = make()
    reply = lease(service)
    with pytest.raises(LeaseError, match=message):
        push(service, "worker:0", 0, used_of(reply, start, end))
    (status,) = service.handle(request(StatusRequest()))
    assert status.body.step == 0


def test_positions_of_a_lease_never_issued_are_refused():
    service = make()
    reply = lease(service)
    with pytest.raises(LeaseError, match="lease 99, which was never issued"):
        push(service, "worker:0", 0, UsedPositions(reply.book, ((99, 0, 5),)))


def test_positions_of_another_tasks_lease_are_refused_naming_it():
    service = make()
    reply = lease(service, "worker:1")
    with pytest.raises(LeaseError, match="leased to worker:1"):
        push(service, "worker:0", 0, used_of(reply))
