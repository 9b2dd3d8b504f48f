"""A sync replica with no data for a step pushes empty (the tail of the last epoch asked for):
zeros sent as any push's gradients, marked empty. The step does not wait for them and does not
average them in; a step nobody brought a gradient to moves nothing; with backup workers the
empty pushes lower what the step needs instead of filling it. Its LeasedBatches takes part in
steps instead of pausing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shoal.ps.adoption import CatchUp, place_adopted
from shoal.ps.errors import PsError
from shoal.ps.optimizers import Momentum, SGD
from shoal.ps.protocol import (ASYNC, AdoptRequest, FailedRequest, InitRequest, LeaseReply, LeaseState, Mode,
                               PushOutcome, PushReply, PushRequest, ReadyRequest, ReleaseRequest, TrainingMode)
from shoal.ps.service import PsService
from shoal.ps.sync import SyncAggregator
from shoal.train.leased_data import LeasedBatches, LeaseWaitError
from shoal.train.placement import PlacementStrategy, place_variables
from shoal.train.rehome_placement import rehome
from shoal.train.rehoming import PsRehomed, resend_moved
from shoal.wire import Message, Request

_rids = itertools.count(1)
ZEROS = {"w": np.zeros(3, np.float32)}


def request(message, tensors=None):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(b"peer", Message(header, dict(tensors or {})))


def sync_service(replicas=2, aggregate=None, rule=SGD(1.0), shards=("w",)):
    service = PsService("ps:0", replicas, lambda reason: None)
    service.handle(request(InitRequest(rule.to_config(), TrainingMode(Mode.SYNC, aggregate or replicas)),
                           {name: np.zeros(3, np.float32) for name in shards}))
    service.handle(request(ReadyRequest()))
    return service


def push(service, task, step, value=None, empty=False, shards=("w",), ends_step=True):
    tensors = {name: np.full(3, 0.0 if value is None else value, np.float32) for name in shards}
    return service.handle(request(PushRequest(task, step, ends_step=ends_step, empty=empty), tensors))


def test_an_empty_push_lowers_what_the_step_needs_and_the_average_is_of_the_gradients_that_came():
    agg = SyncAggregator(replicas=2)
    assert agg.add("worker:0", 0, {"w": np.zeros(2), "b": np.zeros(1)}, empty=True) is PushOutcome.ACCUMULATED
    assert agg.add("worker:1", 0, {"w": np.array([2.0, 4.0]), "b": np.array([1.0])}) is PushOutcome.APPLIED
    ready = agg.take({"w", "b"})
    np.testing.assert_array_equal(ready["w"], [2.0, 4.0])  # not halved by the replica that had no data
    np.testing.assert_array_equal(ready["b"], [1.0])
    assert agg.step == 1


def test_a_step_every_replica_pushed_empty_advances_with_no_update():
    agg = SyncAggregator(replicas=2, step=3)
    agg.add("worker:0", 3, {"w": np.zeros(1)}, empty=True)
    assert agg.add("worker:1", 3, {"w": np.zeros(1)}, empty=True) is PushOutcome.APPLIED
    assert agg.take({"w"}) == {}  # nothing to apply
    assert agg.step == 4 and agg.applied(("w",), 3)


def test_an_empty_push_twice_in_a_step_is_a_duplicate_and_one_for_an_old_step_is_stale():
    agg = SyncAggregator(replicas=2, step=5)
    agg.add("worker:0", 5, {"w": np.zeros(1)}, empty=True)
    assert agg.add("worker:0", 5, {"w": np.zeros(1)}, empty=True) is PushOutcome.DUPLICATE
    assert agg.add("worker:0", 5, {"w": np.ones(1)}) is PushOutcome.DUPLICATE
    assert agg.add("worker:1", 4, {"w": np.zeros(1)}, empty=True) is PushOutcome.STALE


def test_with_a_backup_worker_empty_pushes_do_not_fill_the_quorum_in_place_of_the_gradient_that_has_data():
    """3 workers, 2 gradients per step (1 backup). Two run out of data: the step needs the third's
    gradient, not any two pushes (two empty ones would drop it as stale, step after step)."""
    service = sync_service(replicas=3, aggregate=2)
    for step in range(3):
        assert push(service, "worker:0", step, empty=True) == []
        assert push(service, "worker:1", step, empty=True) == []
        replies = push(service, "worker:2", step, 1.0)
        assert [r.body.outcome for r in replies] == [PushOutcome.APPLIED] * 3
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -3.0))  # each step applied its gradient


def test_with_a_backup_worker_one_empty_push_leaves_the_step_waiting_for_the_two_that_have_data():
    agg = SyncAggregator(replicas=2, backups=1)
    agg.add("worker:0", 0, {"w": np.zeros(1)}, empty=True)
    assert agg.add("worker:1", 0, {"w": np.ones(1)}) is PushOutcome.ACCUMULATED  # as without the empty push
    assert agg.add("worker:2", 0, {"w": np.ones(1)}) is PushOutcome.APPLIED


def test_the_ps_answers_an_empty_push_with_the_step_of_the_others_gradients():
    service = sync_service()
    assert push(service, "worker:0", 0, empty=True) == []  # waits for the step
    replies = push(service, "worker:1", 0, 3.0)
    assert {r.request.header["task"] for r in replies} == {"worker:0", "worker:1"}
    assert all(r.body == PushReply(1, PushOutcome.APPLIED) for r in replies)
    empty_reply = next(r for r in replies if r.request.header["task"] == "worker:0")
    np.testing.assert_array_equal(empty_reply.tensors["w"], np.full(3, -3.0))  # worker:1's gradient, whole


def test_a_step_nobody_brought_a_gradient_to_moves_no_value_even_with_momentum():
    service = sync_service(rule=Momentum(learning_rate=1.0, momentum=0.5))
    push(service, "worker:0", 0, 1.0)
    (reply, _) = push(service, "worker:1", 0, 1.0)
    np.testing.assert_array_equal(reply.tensors["w"], np.full(3, -1.0))  # velocity 1 now
    push(service, "worker:0", 1, empty=True)
    replies = push(service, "worker:1", 1, empty=True)
    assert [r.body.step for r in replies] == [2, 2]
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -1.0))  # a zero gradient would move it


def test_the_departure_counts_only_the_gradients_that_brought_data():
    service = sync_service()
    push(service, "worker:0", 0, 1.0)
    push(service, "worker:1", 0, 1.0)
    push(service, "worker:0", 1, empty=True)
    push(service, "worker:1", 1, 2.0)
    assert (service.membership.applied("worker:0"), service.membership.applied("worker:1")) == (1, 2)


def test_a_part_whose_shard_only_empty_pushes_came_to_is_answered_before_the_step_ends():
    service = sync_service(rule=Momentum(learning_rate=1.0, momentum=0.5), shards=("w", "v"))
    for task in ("worker:0", "worker:1"):  # step 0: velocity 1 on both shards
        push(service, task, 0, 1.0, shards=("w", "v"))
    push(service, "worker:0", 1, empty=True, shards=("w",), ends_step=False)
    replies = push(service, "worker:1", 1, empty=True, shards=("w",), ends_step=False)
    assert sorted(r.request.header["task"] for r in replies) == ["worker:0", "worker:1"]  # before v's gradients
    assert service.step == 1  # the step waits for v
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -1.0))  # no update: momentum would move it
    assert push(service, "worker:0", 1, 1.0, shards=("v",)) == []
    (reply, _) = push(service, "worker:1", 1, 3.0, shards=("v",))
    np.testing.assert_array_equal(reply.tensors["v"], np.full(3, -3.5))  # -1 - (0.5 * 1 + 2)
    assert service.step == 2


def test_a_lagging_shard_that_a_departure_leaves_caught_up_by_empty_pushes_answers_them():
    service = sync_service(replicas=3, shards=("a",))
    for task in ("worker:0", "worker:1", "worker:2"):
        push(service, task, 0, 1.0, shards=("a",))
    service.handle(request(AdoptRequest(1, 0, (1,)), {"b": np.zeros(3, np.float32)}))  # "b" lags at step 0
    assert push(service, "worker:0", 0, empty=True, shards=("b",)) == []
    assert push(service, "worker:1", 0, empty=True, shards=("b",)) == []
    replies = service.handle(request(FailedRequest("worker:2")))  # it held the rest
    assert sorted(r.request.header["task"] for r in replies if isinstance(r.body, PushReply)) == [
        "worker:0", "worker:1"]


def test_an_async_ps_refuses_an_empty_push_naming_the_fix():
    service = PsService("ps:0", 2, lambda reason: None)
    service.handle(request(InitRequest(SGD(1.0).to_config(), ASYNC), dict(ZEROS)))
    service.handle(request(ReadyRequest()))
    with pytest.raises(PsError, match="only a sync ps takes.*same --sync"):
        push(service, "worker:0", 0, empty=True)


def test_an_empty_push_of_a_shard_that_moved_away_is_answered_moved():
    service = sync_service(shards=("a", "b"))
    service.handle(request(ReleaseRequest(("b",), 2)))
    (reply,) = push(service, "worker:0", 0, empty=True, shards=("a", "b"))
    assert reply.body.outcome is PushOutcome.MOVED and reply.body.moved == ("b",)


def test_an_empty_push_resent_after_its_ps_was_rehomed_carries_its_zeros_marked_empty():
    old = place_variables({"a": np.zeros(4), "b": np.zeros(4)}, 2, PlacementStrategy.ROUND_ROBIN)
    moved = PsRehomed("ps:1 re-homed", 1, old, rehome(old, 1))
    sent = []

    class Client:
        def push_all(self, task, step, parts, into, hyper, **kw):
            sent.append((parts, kw))
            return []

    resend_moved(Client(), "worker:0", 0, moved, {"a": np.zeros(4), "b": np.zeros(4)}, None, {}, empty=True)
    ((parts, kw),) = sent
    assert [list(grads) for _, grads in parts] == [["b"]] and kw["empty"] is True


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


# Found by review: members leaving while empty pushes are counted, and re-homed shards.

def test_with_a_backup_the_worker_left_alone_after_the_holder_died_is_not_stuck_in_its_empty_push():
    service = sync_service(replicas=2, aggregate=1)  # 1 backup
    assert push(service, "worker:0", 0, empty=True) == []
    replies = service.handle(request(FailedRequest("worker:1")))  # the holder of the rest dies
    assert [r.body.step for r in replies if isinstance(r.body, PushReply)] == [1]  # no update, the step goes on
    assert service.step == 1


def test_an_idle_worker_that_dies_mid_step_stops_counting_so_the_step_still_waits_for_the_one_with_data():
    service = sync_service(replicas=3)
    push(service, "worker:0", 0, 1.0)
    push(service, "worker:1", 0, empty=True)
    service.handle(request(FailedRequest("worker:1")))
    assert service.step == 0  # worker:2 has data and has not pushed
    replies = push(service, "worker:2", 0, 3.0)
    assert service.step == 1
    np.testing.assert_array_equal(replies[-1].tensors["w"], np.full(3, -2.0))  # the average of the two


def test_a_lagging_shard_whose_catch_up_step_only_empty_pushes_came_to_stops_lagging():
    catch_up = CatchUp()
    catch_up.start({"x"}, step=4, replicas=2)
    catch_up.add("worker:0", 4, {"x": np.zeros(1)}, None, empty=True)
    outcome, ready, _ = catch_up.add("worker:1", 4, {"x": np.zeros(1)}, None, empty=True)
    assert outcome is PushOutcome.APPLIED and ready == {}
    assert catch_up.lagging == frozenset()


def test_the_catch_up_of_a_re_homed_shard_keeps_the_backups_of_its_ps():
    main, catch_up = SyncAggregator(2, step=5, backups=1), CatchUp()
    place_adopted(main, catch_up, ["x"], 4)
    catch_up.add("worker:0", 4, {"x": np.zeros(1)}, None, empty=True)
    outcome, _, _ = catch_up.add("worker:1", 4, {"x": np.zeros(1)}, None, empty=True)
    assert outcome is PushOutcome.ACCUMULATED  # the gradient with data is still to come


def test_a_re_homed_shard_caught_up_by_empty_pushes_does_not_hold_up_the_next_step():
    from tests.unit.test_ps_adoption import adopt, make_service, status
    service = make_service()

    def part(task, step, name, value, empty=False, ends_step=True):
        return service.handle(request(PushRequest(task, step, ends_step=ends_step, empty=empty),
                                      {name: np.full(2, value)}))

    part("worker:0", 0, "a", 0.0, empty=True)
    part("worker:1", 0, "a", 0.0, empty=True)
    assert status(service).step == 1
    adopt(service, 0)  # "b" lags: its values are of step 0
    part("worker:0", 0, "b", 0.0, empty=True)
    part("worker:1", 0, "b", 0.0, empty=True)
    for task in ("worker:0", "worker:1"):  # step 1 in two parts
        part(task, 1, "a", 1.0, ends_step=False)
        part(task, 1, "b", 1.0)
    assert status(service).step == 2
