"""A sync replica with no data for a step pushes empty (the tail of the last epoch asked for):
it counts toward the step's quorum, adds nothing to the average, and a step nobody brought a
gradient to moves nothing. Its LeasedBatches takes part in steps instead of pausing."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.protocol import (ASYNC, LeaseReply, LeaseState, Mode, PushOutcome, PushReply, PushRequest,
                               TrainingMode)
from shoal.ps.sync import SyncAggregator
from shoal.train.leased_data import LeasedBatches, LeaseWaitError
from tests.unit.test_ps_service import make_service, push, request

SYNC2 = TrainingMode(Mode.SYNC, 2)


def test_an_empty_push_counts_toward_the_quorum_and_the_average_is_of_the_gradients_that_came():
    agg = SyncAggregator(replicas=2)
    assert agg.add_empty("worker:0", 0, ("w", "b")) is PushOutcome.ACCUMULATED
    assert agg.add("worker:1", 0, {"w": np.array([2.0, 4.0]), "b": np.array([1.0])}) is PushOutcome.APPLIED
    ready = agg.take({"w", "b"})
    np.testing.assert_array_equal(ready["w"], [2.0, 4.0])  # not halved by the replica that had no data
    np.testing.assert_array_equal(ready["b"], [1.0])
    assert agg.step == 1


def test_a_step_every_replica_pushed_empty_advances_with_no_update():
    agg = SyncAggregator(replicas=2, step=3)
    agg.add_empty("worker:0", 3, ("w",))
    assert agg.add_empty("worker:1", 3, ("w",)) is PushOutcome.APPLIED
    assert agg.take({"w"}) == {}  # nothing to apply: no optimizer step on a zero gradient
    assert agg.step == 4 and agg.applied(("w",), 3)


def test_an_empty_push_twice_in_a_step_is_a_duplicate_and_one_for_an_old_step_is_stale():
    agg = SyncAggregator(replicas=2, step=5)
    agg.add_empty("worker:0", 5, ("w",))
    assert agg.add_empty("worker:0", 5, ("w",)) is PushOutcome.DUPLICATE
    assert agg.add("worker:0", 5, {"w": np.ones(1)}) is PushOutcome.DUPLICATE
    assert agg.add_empty("worker:1", 4, ("w",)) is PushOutcome.STALE


def test_the_ps_answers_an_empty_push_with_the_step_of_the_others_gradients_and_its_values():
    service, _ = make_service(training=SYNC2)
    assert service.handle(request(PushRequest("worker:0", 0, empty=True))) == []  # waits for the step
    replies = push(service, "worker:1", 0, 3.0)
    assert {r.request.header["task"] for r in replies} == {"worker:0", "worker:1"}
    assert all(r.body == PushReply(1, PushOutcome.APPLIED) for r in replies)
    empty_reply = next(r for r in replies if r.request.header["task"] == "worker:0")
    np.testing.assert_array_equal(empty_reply.tensors["w"], np.full(3, -3.0))  # worker:1's gradient, whole


def test_a_sync_step_both_replicas_pushed_empty_leaves_the_values_as_they_were():
    service, _ = make_service(training=SYNC2)
    service.handle(request(PushRequest("worker:0", 0, empty=True)))
    replies = service.handle(request(PushRequest("worker:1", 0, empty=True)))
    assert [r.body.step for r in replies] == [1, 1]
    np.testing.assert_array_equal(replies[0].tensors["w"], np.zeros(3))


def test_an_async_ps_refuses_an_empty_push_naming_the_fix():
    service, _ = make_service(training=ASYNC)
    with pytest.raises(PsError, match="only a sync step takes.*same --sync"):
        service.handle(request(PushRequest("worker:0", 0, empty=True)))


def test_an_empty_push_that_carries_tensors_is_refused():
    service, _ = make_service(training=SYNC2)
    with pytest.raises(PsError, match="empty push carries 1 tensors"):
        service.handle(request(PushRequest("worker:0", 0, empty=True), {"w": np.ones(3, np.float32)}))


class ScriptedLeases:
    """A PsClient's `lease`, answering from a script of replies."""

    def __init__(self, replies):
        self.replies = list(replies)

    def lease(self, request):
        return self.replies.pop(0)


WAIT = LeaseReply(LeaseState.WAIT, "book", epoch=0, held_by=("worker:1",))


def test_with_no_free_position_the_stream_takes_part_in_steps_instead_of_pausing_until_positions_come():
    idle, slept, now = [], [], [0.0]

    def idle_step():  # a step of 200 s: three of them outlast the wait, unless each restarts it
        idle.append(1)
        now[0] += 200

    stream = LeasedBatches(ScriptedLeases([WAIT, WAIT, WAIT, LeaseReply(LeaseState.GRANTED, "book", 1, 0, 0, 4)]),
                           "worker:0", "h0", 100, 4, epochs=1, shuffle=False, wait_timeout_s=300,
                           idle_step=idle_step, sleep=slept.append, clock=lambda: now[0])
    batch = next(stream)
    assert list(batch.indices) == [0, 1, 2, 3]
    assert len(idle) == 3 and slept == []


def test_a_stream_taking_part_in_steps_ends_when_the_epochs_are_consumed():
    idle = []
    stream = LeasedBatches(ScriptedLeases([WAIT, LeaseReply(LeaseState.EXHAUSTED, "book")]), "worker:0", "h0", 100, 4,
                           epochs=1, idle_step=lambda: idle.append(1), sleep=lambda s: None)
    assert list(stream) == [] and idle == [1]


def test_without_an_idle_step_the_stream_pauses_and_its_wait_expires():
    stream = LeasedBatches(ScriptedLeases([WAIT] * 5), "worker:0", "h0", 100, 4, epochs=1, wait_timeout_s=0.0,
                           sleep=lambda s: None)
    with pytest.raises(LeaseWaitError, match="held by worker:1"):
        next(stream)
