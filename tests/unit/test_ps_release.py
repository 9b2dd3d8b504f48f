"""Moving shards onto a ps that joined, on the ps side: `join` registers a ps with ps 0 (bounded,
validated), `release` hands shards over and answers every push or pull naming them MOVED (never
applied, never counted, never left waiting), `place` keeps the placement history. The sync test
at the end moves a shard mid-step between two real services and checks every gradient is applied
exactly once."""

import itertools

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import (ASYNC, MAX_JOINED, MAX_REASON, AdoptRequest, ChangeKind, InitRequest, JoinRequest, Mode, PlaceRequest,
                               PlacementChange, ProtocolFieldError, PullReply, PullRequest, PushOutcome, PushReply,
                               PushRequest, ReadyRequest, ReleaseReply, ReleaseRequest, ReleaseState, StatusReply, StatusRequest, TrainingMode)
from shoal.ps.service import PsService
from shoal.wire import Message, Request

_rids = itertools.count(1)
SYNC2 = TrainingMode(Mode.SYNC, 2)


def request(message, tensors=None):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(b"peer", Message(header, dict(tensors or {})))


def make_service(training=SYNC2, step=0, index=0, shards=("a", "b")):
    service = PsService(f"ps:{index}", 2, lambda reason: None, ps_index=index, num_ps=2)
    service.handle(request(InitRequest(SGD(1.0).to_config(), training, step), {s: np.zeros(2) for s in shards}))
    service.handle(request(ReadyRequest()))
    return service


def push(service, task, step, **grads):
    return service.handle(request(PushRequest(task, step), {k: np.full(2, v) for k, v in grads.items()}))


def release(service, *names, target=2):
    (reply,) = service.handle(request(ReleaseRequest(names, target)))
    return reply


def status(service) -> StatusReply:
    return StatusReply.decode(service.handle(request(StatusRequest()))[0].body.fields())


# --- join ------------------------------------------------------------------------------------

def test_join_registers_a_ps_with_ps0_and_status_lists_it():
    service = make_service()
    service.handle(request(JoinRequest(2, "127.0.0.1:5002")))
    service.handle(request(JoinRequest(2, "127.0.0.1:5002")))  # a repeat is harmless
    assert [(j.index, j.address) for j in status(service).joined] == [(2, "127.0.0.1:5002")]


def test_join_of_an_index_registered_at_another_address_is_refused_naming_both_and_the_next_index():
    service = make_service()
    service.handle(request(JoinRequest(2, "127.0.0.1:5002")))
    with pytest.raises(PsError, match=r"ps:2 registered already at 127.0.0.1:5002.*127.0.0.1:6000.*ps:3"):
        service.handle(request(JoinRequest(2, "127.0.0.1:6000")))


def test_join_registry_is_capped_so_a_ps_spends_bounded_memory_on_it():
    service = make_service()
    for i in range(1, MAX_JOINED + 1):
        service.handle(request(JoinRequest(i, f"h{i}:1")))
    with pytest.raises(PsError, match=f"at most {MAX_JOINED}"):
        service.handle(request(JoinRequest(MAX_JOINED + 1, "h:1")))
    assert len(status(service).joined) == MAX_JOINED


def test_join_sent_to_a_ps_other_than_ps0_is_refused():
    with pytest.raises(PsError, match="ps:0 only"):
        make_service(index=1).handle(request(JoinRequest(2, "h:1")))


@pytest.mark.parametrize("fields", [{"index": 2, "address": "no-port"}, {"index": 2, "address": "h:0"},
                                    {"index": 2, "address": "h:70000"}, {"index": 2, "address": "h:1" * 100},
                                    {"index": 0, "address": "h:1"}, {"index": 2, "address": 5}])
def test_join_request_with_a_bad_index_or_address_is_refused_naming_the_field(fields):
    with pytest.raises(ProtocolFieldError, match="index|address"):
        JoinRequest.decode(fields)


def test_status_with_more_registered_ps_than_the_cap_is_refused():
    fields = dict(status(make_service()).fields(), joined=[[i, "h:1"] for i in range(MAX_JOINED + 1)])
    with pytest.raises(ProtocolFieldError, match="joined"):
        StatusReply.decode(fields)


# --- release ---------------------------------------------------------------------------------

def test_release_hands_over_values_and_slots_and_later_pushes_and_pulls_are_answered_moved():
    service = make_service(training=ASYNC)
    push(service, "worker:0", 0, a=1.0, b=2.0)
    reply = release(service, "b")
    assert reply.body.step == 1 and set(reply.tensors) == {"b"}
    np.testing.assert_array_equal(reply.tensors["b"], np.full(2, -2.0))
    (moved,) = push(service, "worker:0", 1, a=1.0, b=1.0)
    assert moved.body == PushReply(1, PushOutcome.MOVED, moved=("b",)) and not moved.tensors
    np.testing.assert_array_equal(service.store.values(["a"])["a"], np.full(2, -1.0))  # nothing of it applied
    assert status(service).step == 1  # nor counted
    (pulled,) = service.handle(request(PullRequest(("a", "b"))))
    assert pulled.body.moved == ("b",) and not pulled.tensors


def test_release_of_an_unknown_shard_is_refused_naming_it():
    with pytest.raises(PsError, match="'c'"):
        release(make_service(), "c")


def test_sync_push_waiting_for_its_step_that_includes_a_released_shard_is_answered_moved():
    service = make_service()
    assert push(service, "worker:0", 0, a=1.0, b=1.0) == []  # waits for worker:1
    pull = request(PullRequest(("a", "b"), min_step=1))
    assert service.handle(pull) == []
    reply = service.handle(request(ReleaseRequest(("b",), 2)))
    bodies = {type(r.body): r.body for r in reply[1:]}
    assert bodies[PushReply] == PushReply(0, PushOutcome.MOVED, moved=("b",))
    assert bodies[PullReply].moved == ("b",)


def test_sync_release_of_shards_half_applied_this_step_is_refused_until_the_step_is_done():
    service = make_service(shards=("a", "b", "c"))
    push(service, "worker:0", 0, a=1.0)
    push(service, "worker:1", 0, a=1.0)  # "a" applied for step 0, "b" and "c" not
    refused = release(service, "a", "b")
    assert refused.body.state is ReleaseState.BUSY and "ask again" in refused.body.reason and not refused.tensors
    assert release(service, "a").body.step == 1  # all applied: of step 1
    assert release(service, "b").body.step == 0


def test_a_busy_reply_naming_long_shards_still_decodes_as_busy():
    names = tuple(f"encoder/layer_{i:02d}/attention/output/dense/kernel/part_{i}" + "x" * 40 for i in range(6))
    service = make_service(shards=names)
    for task in ("worker:0", "worker:1"):
        service.handle(request(PushRequest(task, 0), {names[0]: np.ones(2)}))  # names[0] applied, the rest not
    refused = release(service, *names)
    decoded = ReleaseReply.decode(refused.body.fields())  # as the chief reads it off the wire
    assert decoded.state is ReleaseState.BUSY and decoded.reason.startswith("ps:0 has applied step 0")
    assert len(refused.body.reason) > MAX_REASON >= len(decoded.reason) and decoded.reason.endswith("...")


def test_sync_step_completes_without_the_released_shards():
    service = make_service()
    push(service, "worker:0", 0, a=1.0, b=1.0)
    push(service, "worker:1", 0, a=1.0)  # "a" complete; the step waits for "b"
    assert status(service).step == 0
    replies = service.handle(request(ReleaseRequest(("b",), 2)))
    assert [r.body.outcome for r in replies[1:]] == [PushOutcome.MOVED]  # worker:0's push, which named "b"
    assert status(service).step == 1


def test_a_pull_waiting_for_the_next_step_is_answered_when_a_release_completes_the_step():
    """The release advances the step with nothing left to apply: the pull that waited for that
    step must be answered then, not at some later apply (a quorum member waiting there would
    never push the gradient that apply needs)."""
    service = make_service()
    push(service, "worker:0", 0, a=1.0, b=1.0)
    push(service, "worker:1", 0, a=1.0)  # "a" applied for step 0; the step waits for "b"
    assert service.handle(request(PullRequest(("a",), 1))) == []  # waits for step 1
    replies = service.handle(request(ReleaseRequest(("b",), 2)))
    pulls = [r for r in replies if isinstance(r.body, PullReply)]
    assert [p.body.step for p in pulls] == [1], replies


def test_sync_gradients_are_applied_exactly_once_when_a_shard_moves_mid_step():
    """ps A holds a and b; b moves to ps N mid-step: worker:0 had pushed (counted at A, answered
    MOVED), worker:1 pushes after the release (MOVED). Both send the part again by the new
    placement; the result equals one ps aggregating both gradients once."""
    a_ps = make_service()
    assert push(a_ps, "worker:0", 0, a=1.0, b=2.0) == []
    moved = a_ps.handle(request(ReleaseRequest(("b",), 1)))
    handed, answered = moved[0], moved[1]
    assert answered.body.outcome is PushOutcome.MOVED
    new_ps = PsService("ps:1", 2, lambda reason: None, ps_index=1, num_ps=2)
    new_ps.handle(request(InitRequest(SGD(1.0).to_config(), SYNC2, handed.body.step), handed.tensors))
    new_ps.handle(request(ReadyRequest()))
    (late,) = push(a_ps, "worker:1", 0, a=3.0, b=4.0)
    assert late.body.outcome is PushOutcome.MOVED
    # worker:0 sends its part again: "a" was counted already (duplicate), "b" goes to N
    (dup,) = push(a_ps, "worker:0", 0, a=1.0)
    assert dup.body.outcome is PushOutcome.DUPLICATE
    assert push(new_ps, "worker:0", 0, b=2.0) == []
    # worker:1 sends its whole part again: nothing of it was counted
    assert {r.body.outcome for r in push(a_ps, "worker:1", 0, a=3.0)} == {PushOutcome.APPLIED}
    assert {r.body.outcome for r in push(new_ps, "worker:1", 0, b=4.0)} == {PushOutcome.APPLIED}
    np.testing.assert_array_equal(a_ps.store.values(["a"])["a"], np.full(2, -2.0))  # (1 + 3) / 2 once
    np.testing.assert_array_equal(new_ps.store.values(["b"])["b"], np.full(2, -3.0))  # (2 + 4) / 2 once
    assert status(a_ps).step == 1 and status(new_ps).step == 1


def test_adopt_of_moving_shards_retires_nothing():
    service = make_service()
    service.handle(request(AdoptRequest(0, 0, (), moving=True), {"c": np.zeros(2)}))
    assert status(service).retired == () and status(service).history == ()


# --- place -----------------------------------------------------------------------------------

def test_place_keeps_the_history_and_refuses_one_that_does_not_extend_it():
    service = make_service()
    join = PlacementChange(ChangeKind.JOIN, 2, "h:1")
    service.handle(request(PlaceRequest((join,))))
    assert status(service).history == (join,)
    with pytest.raises(PsError, match="not a prefix"):
        service.handle(request(PlaceRequest((PlacementChange(ChangeKind.RETIRE, 1),))))


def test_a_retirement_by_adopt_extends_the_history_after_a_join():
    service = make_service()
    join = PlacementChange(ChangeKind.JOIN, 2, "h:1")
    service.handle(request(PlaceRequest((join,))))
    service.handle(request(AdoptRequest(1, 0, (1,)), {"c": np.zeros(2)}))
    assert status(service).history == (join, PlacementChange(ChangeKind.RETIRE, 1))
    assert status(service).retired == (1,)
