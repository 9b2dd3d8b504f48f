"""Re-homing on the ps side (shoal/ps/adoption.py): `adopt` installs a dead ps's shards on a survivor,
placed against the survivor's sync step so that the workers' resent gradients of the step in flight
complete it exactly once."""

import itertools

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import (ASYNC, AdoptReply, AdoptRequest, ChangeKind, InitRequest, Mode, ProtocolFieldError,
                               PlacementChange, PlaceRequest, PullRequest, PushOutcome, PushRequest, ReadyRequest,
                               StatusReply, StatusRequest, TrainingMode)
from shoal.ps.service import PsService
from shoal.wire import Message, Request

_rids = itertools.count(1)
SYNC2 = TrainingMode(Mode.SYNC, 2)


def request(message, tensors=None):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(b"peer", Message(header, dict(tensors or {})))


def make_service(training=SYNC2, step=0):
    service = PsService("ps:0", 2, lambda reason: None, ps_index=0, num_ps=2)
    service.handle(request(InitRequest(SGD(1.0).to_config(), training, step), {"a": np.zeros(2)}))
    service.handle(request(ReadyRequest()))
    return service


def adopt(service, step, value=0.0):
    (reply,) = service.handle(request(AdoptRequest(1, step, (1,)), {"b": np.full(2, value)}))
    return reply.body


def push(service, task, step, **grads):
    return service.handle(request(PushRequest(task, step), {k: np.full(2, v) for k, v in grads.items()}))


def status(service) -> StatusReply:
    return StatusReply.decode(service.handle(request(StatusRequest()))[0].body.fields())


def test_adopt_request_round_trips_and_must_name_its_source_last_among_the_retired():
    message = AdoptRequest(1, 7, (3, 1))
    assert AdoptRequest.decode(message.fields()) == message
    with pytest.raises(ProtocolFieldError, match="retired"):
        AdoptRequest.decode({"source": 1, "step": 7, "retired": [1, 3]})
    with pytest.raises(ProtocolFieldError, match="retired"):
        AdoptRequest.decode({"source": 1, "step": 7, "retired": [1, 1]})


def test_status_names_the_retired_ps_after_an_adopt_and_none_before():
    service = make_service()
    assert status(service).retired == ()
    assert adopt(service, 0) == AdoptReply(1, 0)
    assert status(service).retired == (1,)
    assert adopt(service, 0) == AdoptReply(0, 0)  # a repeated adopt creates nothing again


def test_adopt_before_init_is_refused_naming_the_source():
    service = PsService("ps:0", 2, lambda reason: None)
    with pytest.raises(PsError, match="ps:1"):
        service.handle(request(AdoptRequest(1, 0, (1,)), {"b": np.zeros(2)}))


def test_adopted_shards_of_the_current_step_complete_it_with_the_resent_gradients():
    service = make_service()
    adopt(service, 0)
    assert push(service, "worker:0", 0, a=1.0) == []
    assert len(push(service, "worker:1", 0, a=3.0)) == 2  # the parts of "a" are answered ...
    assert status(service).step == 0  # ... but the step waits for the adopted "b"
    assert push(service, "worker:0", 0, b=2.0) == []
    replies = push(service, "worker:1", 0, b=4.0)
    assert len(replies) == 2 and all(r.body.outcome is PushOutcome.APPLIED for r in replies)
    assert status(service).step == 1
    np.testing.assert_array_equal(service.store.values(["a", "b"])["b"], np.full(2, -3.0))


def test_adopted_shards_one_step_behind_catch_up_with_the_resent_gradients_of_their_step():
    service = make_service()
    push(service, "worker:0", 0, a=1.0)
    push(service, "worker:1", 0, a=3.0)  # this ps finished step 0; the dead one had not
    assert status(service).step == 1
    assert adopt(service, 0).step == 1
    pull = request(PullRequest(("a", "b"), min_step=1))
    assert service.handle(pull) == []  # "b" still holds step 0's values
    assert push(service, "worker:0", 0, b=2.0) == []
    replies = push(service, "worker:1", 0, b=4.0)
    assert pull in [r.request for r in replies]
    assert all(r.body.step == 1 for r in replies)
    values = service.store.values(["a", "b"])
    np.testing.assert_array_equal(values["a"], np.full(2, -2.0))
    np.testing.assert_array_equal(values["b"], np.full(2, -3.0))  # applied once, averaged over both
    # the next step needs both shards again
    assert push(service, "worker:0", 1, a=1.0, b=1.0) == []
    assert len(push(service, "worker:1", 1, a=1.0, b=1.0)) == 2
    assert status(service).step == 2


def test_adopted_shards_one_step_ahead_count_as_applied_and_their_resend_is_stale():
    service = make_service()
    assert adopt(service, 1, value=-5.0).step == 0  # the dead ps had finished step 0, this one not
    assert push(service, "worker:0", 0, a=1.0) == []
    replies = push(service, "worker:1", 0, a=3.0)
    assert status(service).step == 1  # "b" counted as applied: "a" completed the step
    assert len(replies) == 2
    (resent,) = push(service, "worker:1", 0, b=9.0)
    assert resent.body.outcome is PushOutcome.STALE
    np.testing.assert_array_equal(service.store.values(["b"])["b"], np.full(2, -5.0))  # not applied again


def test_a_newer_push_for_lagging_shards_gives_up_their_lost_step():
    service = make_service()
    push(service, "worker:0", 0, a=1.0)
    push(service, "worker:1", 0, a=1.0)
    adopt(service, 0)
    assert push(service, "worker:0", 1, a=1.0, b=1.0) == []  # not only lagging shards: counts as usual
    assert len(push(service, "worker:1", 1, a=1.0, b=1.0)) == 2
    assert status(service).step == 2


def test_async_adopted_shards_just_join_the_store():
    service = make_service(training=ASYNC)
    adopt(service, 7, value=1.0)
    (reply,) = push(service, "worker:0", 0, b=1.0)
    assert reply.body.outcome is PushOutcome.APPLIED
    np.testing.assert_array_equal(service.store.values(["b"])["b"], np.zeros(2))


def test_an_adopt_after_a_place_does_not_repeat_a_retirement_the_history_holds():
    service = make_service(training=ASYNC)  # rebuilt after a restart: the chief tells it the history
    service.handle(request(PlaceRequest((PlacementChange(ChangeKind.RETIRE, 2),))))
    service.handle(request(AdoptRequest(1, 0, (2, 1)), {"b": np.zeros(2)}))
    assert status(service).history == (PlacementChange(ChangeKind.RETIRE, 2), PlacementChange(ChangeKind.RETIRE, 1))
    assert status(service).retired == (2, 1)
