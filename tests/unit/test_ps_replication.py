"""Shard replication without sockets: the replica book, the replicate / replica ops, the
service's own replica, rolled-back pushes, and the replication options."""

import itertools

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.optimizers import SGD, Adam
from shoal.ps.protocol import (ASYNC, InitRequest, Mode, ProtocolFieldError, PushOutcome, PushReply, PushRequest,
                               ReadyRequest, ReplicaReply, ReplicaRequest, ReplicateReply, ReplicateRequest,
                               TrainingMode)
from shoal.ps.replicas import ReplicaBook, ReplicaError
from shoal.ps.replicator import ReplicationOptions, Replicator
from shoal.ps.service import PsService
from shoal.wire import JobSecret, Message, Request

_rids = itertools.count(1)
SYNC2 = TrainingMode(Mode.SYNC, 2)


def request(message, tensors=None):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(b"peer", Message(header, dict(tensors or {})))


def replicate(source=0, incarnation="a" * 16, step=5, training=ASYNC, rule=None):
    return ReplicateRequest(source, incarnation, step, training, rule or SGD(1.0).to_config())


def tensors(value=1.0):
    return {"w": np.full(3, value, np.float32)}


def make_service(ps_index=0, num_ps=2, training=ASYNC, rule=SGD(1.0)):
    service = PsService(f"ps:{ps_index}", 2, lambda reason: None, ps_index=ps_index, num_ps=num_ps)
    service.handle(request(InitRequest(rule.to_config(), training), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    return service


# --- the book ---------------------------------------------------------------------------------

def test_book_holds_the_predecessors_replica_and_answers_it():
    book = ReplicaBook(1, 3, clock=lambda: 10.0)
    assert book.accept(replicate(source=0, step=7), tensors(2.0)) == 7
    reply, held = book.reply(0)
    assert reply.present and reply.step == 7 and reply.incarnation == "a" * 16
    np.testing.assert_array_equal(held["w"], np.full(3, 2.0))
    assert book.reply(2) == (ReplicaReply(False, 2), None)


def test_book_refuses_a_replica_from_a_ps_that_is_not_its_predecessor():
    book = ReplicaBook(1, 3)
    with pytest.raises(ReplicaError, match=r"replica of ps:2, but holds only ps:0's"):
        book.accept(replicate(source=2), tensors())
    assert book.held is None


def test_book_refuses_any_replica_in_a_job_with_one_ps():
    with pytest.raises(ReplicaError, match="holds none"):
        ReplicaBook(0, 1).accept(replicate(source=0), tensors())


def test_book_refuses_a_replica_without_values_or_with_orphan_slots_keeping_the_held_one():
    book = ReplicaBook(0, 2)
    book.accept(replicate(source=1, step=3), tensors())
    with pytest.raises(ReplicaError, match="without any shard values"):
        book.accept(replicate(source=1, step=4), {})
    with pytest.raises(ReplicaError, match=r"optimizer state for \['v'\] but not their values"):
        book.accept(replicate(source=1, step=4), {**tensors(), "v@m": np.zeros(3)})
    assert book.held.request.step == 3


def test_book_replaces_the_held_replica_whole():
    book = ReplicaBook(0, 2)
    book.accept(replicate(source=1, step=3), {"w": np.zeros(3), "w@m": np.zeros(3), "x": np.zeros(2)})
    book.accept(replicate(source=1, step=4), tensors(5.0))
    assert set(book.held.tensors) == {"w"} and book.held.request.step == 4
    assert book.held.nbytes == 12


def test_book_ignores_an_older_replica_of_the_same_process_but_takes_one_from_a_new_process():
    book = ReplicaBook(0, 2)
    book.accept(replicate(source=1, step=9), tensors(9.0))
    assert book.accept(replicate(source=1, step=8), tensors(8.0)) == 9
    assert book.held.request.step == 9
    assert book.accept(replicate(source=1, step=2, incarnation="b" * 16), tensors(2.0)) == 2  # ps:1 restarted
    assert book.held.request.incarnation == "b" * 16


def test_book_refuses_an_index_outside_the_ring():
    with pytest.raises(ReplicaError, match="outside a ring of 2"):
        ReplicaBook(2, 2)


# --- the ops on the wire --------------------------------------------------------------------------

def test_replicate_and_replica_messages_round_trip():
    r = ReplicateRequest(1, "c" * 16, 12, SYNC2, SGD(0.5).to_config(), {"epoch": 1})
    assert ReplicateRequest.decode(r.fields()) == r
    reply = ReplicaReply(True, 1, "c" * 16, 12, SYNC2, SGD(0.5).to_config(), None, 250)
    assert ReplicaReply.decode(reply.fields()) == reply
    assert ReplicaReply.decode(ReplicaReply(False, 3).fields()) == ReplicaReply(False, 3)
    assert ReplicaRequest.decode(ReplicaRequest(2).fields()) == ReplicaRequest(2)
    assert ReplicateReply.decode({"held_step": 4}) == ReplicateReply(4)


@pytest.mark.parametrize("field, value", [("source", -1), ("source", "0"), ("incarnation", ""), ("step", True),
                                          ("rule", None), ("mode", "both"), ("leases", [])])
def test_replicate_request_with_a_bad_field_is_refused_naming_it(field, value):
    fields = dict(replicate().fields(), **{field: value})
    with pytest.raises(ProtocolFieldError, match=field):
        ReplicateRequest.decode(fields)


def test_push_basis_round_trips_and_is_absent_when_empty():
    assert "basis" not in PushRequest("worker:0", 1).fields()
    assert PushRequest.decode(PushRequest("worker:0", 1, basis="d" * 16).fields()).basis == "d" * 16
    with pytest.raises(ProtocolFieldError, match="basis"):
        PushRequest.decode({"task": "worker:0", "basis": 7})


# --- the service ------------------------------------------------------------------------------

def test_service_holds_a_replicated_copy_apart_from_its_own_shards():
    service = make_service(ps_index=0, num_ps=2)
    (reply,) = service.handle(request(replicate(source=1, step=6), tensors(4.0)))
    assert reply.body == ReplicateReply(6)
    (answer,) = service.handle(request(ReplicaRequest(1)))
    assert answer.body.present and answer.body.step == 6
    np.testing.assert_array_equal(answer.tensors["w"], np.full(3, 4.0))
    np.testing.assert_array_equal(service.store.values(["w"])["w"], np.zeros(3))  # its own shard untouched


def test_service_refuses_a_replica_from_a_ps_other_than_its_predecessor():
    service = make_service(ps_index=0, num_ps=3)
    with pytest.raises(PsError, match="only ps:2's"):
        service.handle(request(replicate(source=1), tensors()))


def test_own_replica_is_a_copy_of_values_slots_and_step():
    service = make_service(rule=Adam(0.1))
    service.handle(request(PushRequest("worker:0", 0), tensors(1.0)))
    request_, copied = service.own_replica()
    assert request_.step == 1 and request_.source == 0 and request_.incarnation == service.incarnation
    assert request_.rule == Adam(0.1).to_config() and {"w", "w@m", "w@v"} <= copied.keys()
    before = copied["w"].copy()
    service.handle(request(PushRequest("worker:0", 1), tensors(1.0)))
    np.testing.assert_array_equal(copied["w"], before)  # later pushes do not change the copy


def test_own_replica_is_none_before_init_and_mid_sync_step():
    assert PsService("ps:0", 2, lambda r: None, num_ps=2).own_replica() is None
    service = PsService("ps:0", 2, lambda r: None, num_ps=2)
    service.handle(request(InitRequest(SGD(1.0).to_config(), SYNC2), {"a": np.zeros(3), "b": np.zeros(3)}))
    service.handle(request(ReadyRequest()))
    for task in ("worker:0", "worker:1"):  # shard a completes step 0, b does not yet
        service.handle(request(PushRequest(task, 0), {"a": np.ones(3)}))
    assert service.own_replica() is None
    for task in ("worker:0", "worker:1"):
        service.handle(request(PushRequest(task, 0), {"b": np.ones(3)}))
    assert service.own_replica()[0].step == 1


def test_async_push_computed_on_an_earlier_process_is_dropped_as_rolled_back():
    service = make_service()
    replies = service.handle(request(PushRequest("worker:0", 0, basis="an-older-process"), tensors(1.0)))
    assert replies[0].body == PushReply(0, PushOutcome.ROLLED_BACK)
    np.testing.assert_array_equal(replies[0].tensors["w"], np.zeros(3))  # not applied; the values come back
    assert replies[0].body.incarnation == service.incarnation  # ... of this process: base the next push on them
    assert service.step == 0
    replies = service.handle(request(PushRequest("worker:0", 0, basis=service.incarnation), tensors(1.0)))
    assert replies[0].body == PushReply(1, PushOutcome.APPLIED)


def test_sync_push_resent_for_a_step_the_restored_values_hold_is_stale_not_applied_again():
    # the chief rebuilds a sync ps at a step >= its replica's: a resent push of an older step is STALE
    service = PsService("ps:1", 2, lambda r: None, ps_index=1, num_ps=2)
    service.handle(request(InitRequest(SGD(1.0).to_config(), SYNC2, step=7), {"w": np.full(3, 5.0, np.float32)}))
    service.handle(request(ReadyRequest()))
    (reply,) = service.handle(request(PushRequest("worker:0", 6, basis="old"), tensors(1.0)))
    assert reply.body.outcome is PushOutcome.STALE
    np.testing.assert_array_equal(service.store.values(["w"])["w"], np.full(3, 5.0))


# --- options and the replicator's schedule ------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [({"every_s": 0}, "every_s=0"), ({"every_steps": 0}, "every_steps=0"),
                                           ({"every_s": 1, "timeout_s": 0}, "timeout_s")])
def test_replication_options_refuse_bad_intervals_naming_them(kwargs, match):
    with pytest.raises(PsError, match=match):
        ReplicationOptions(**kwargs)


def test_replication_is_off_by_default():
    assert not ReplicationOptions().enabled and ReplicationOptions(every_steps=5).enabled


def test_replicator_is_due_after_its_interval_only_if_the_step_moved_and_none_in_flight():
    now = [0.0]
    rep = Replicator(0, 1, "127.0.0.1:1", JobSecret(b"s" * 32, "test"), ReplicationOptions(every_s=1.0, every_steps=10),
                     clock=lambda: now[0])
    assert rep.due(0)  # the first one at once
    rep._offered_step, rep._offered_at = 3, 0.0  # as if a replica of step 3 was sent at t=0
    assert not rep.due(3) and not rep.due(4)
    assert rep.due(13)  # 10 steps
    now[0] = 1.5
    assert rep.due(4) and not rep.due(3)  # 1 s passed; nothing changed at step 3
    rep._busy = True
    assert not rep.due(50)
