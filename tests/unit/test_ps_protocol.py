"""The typed ps protocol: every request and reply round-trips, and a bad or missing field is a
ProtocolFieldError that names the op and the field."""

import pytest

from shoal.ps.errors import PsError
from shoal.ps.membership import MAX_TIMEOUT_S
from shoal.ps.protocol import (ASYNC, MAX_HEARTBEAT_TIMEOUT_MS, REPLY_TYPES, REQUEST_TYPES, ClosureTag, DoneReply,
                               DoneRequest, Empty, FailedRequest, HeartbeatReply, HeartbeatRequest, Hyper,
                               InitReply, InitRequest, Mode, Op, Phase,
                               ProtocolFieldError, PullReply, PullRequest, PushOutcome, PushReply, PushRequest,
                               ReadyRequest, ShutdownRequest, SnapshotReply, SnapshotRequest, StatusReply,
                               StatusRequest, TrainingMode, UsedPositions, parse_op, split_slots)
from shoal.ps.protocol import _MAX_ID, MAX_USED_RANGES

SYNC2 = TrainingMode(Mode.SYNC, 2)
EXAMPLES = [
    StatusRequest(), ReadyRequest(), SnapshotRequest(), Empty(),
    StatusReply(Phase.READY, SYNC2, 7, 3, 1024, 3, ("worker:1",), "ab12"),
    StatusReply(Phase.EMPTY, None, 0, 0, 0, 0, (), "ab12"),
    InitRequest({"name": "sgd", "learning_rate": 0.1}, ASYNC, 5, ("worker:0",)), InitReply(4),
    SnapshotReply(9, SYNC2, {"name": "adam"}),
    PullRequest(("W", "b/part_0"), 3), PullReply(3),
    PushRequest("worker:1", 4, False), PushReply(5, PushOutcome.STALE),
    PushRequest("worker:0", 2, hyper={"W/part_0": Hyper(0.1, 1e-4), "b": Hyper(0.05)}),
    DoneRequest("chief:0"), DoneReply(2), FailedRequest("worker:0"), ShutdownRequest("worker:0"),
    PushRequest("worker:1", 4, closure=ClosureTag("3f2a.17", 2)),
    PushRequest("worker:1", 6, empty=True),
    HeartbeatRequest("worker:1", "ab12", 2000), HeartbeatRequest("worker:1", "ab12", 2000, answer="c0ffee"),
    HeartbeatReply(7, False, 2), HeartbeatReply(7, False, 2, challenge="c0ffee"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_roundtrips_through_its_fields(message):
    assert type(message).decode(message.fields()) == message


@pytest.mark.parametrize("reply", [PullReply(3, "ab12cd34"), PushReply(5, PushOutcome.ROLLED_BACK, "ab12cd34")],
                         ids=lambda r: type(r).__name__)
def test_a_reply_names_the_ps_process_whose_values_it_carries(reply):
    decoded = type(reply).decode(reply.fields())
    assert decoded.incarnation == "ab12cd34"
    assert "incarnation" not in type(reply)(*[getattr(reply, f) for f in ("step", "outcome")
                                              if hasattr(reply, f)]).fields()  # absent when not said


@pytest.mark.parametrize("kind, fields", [(PullReply, {"step": 1, "incarnation": "x" * 65}),
                                          (PushReply, {"step": 1, "outcome": "applied", "incarnation": 7})])
def test_a_reply_with_a_bad_incarnation_is_refused_naming_the_field(kind, fields):
    with pytest.raises(ProtocolFieldError, match="incarnation"):
        kind.decode(fields)


def test_push_header_is_unchanged_when_no_closure_is_given():
    fields = PushRequest("worker:0", 3, hyper={"w": Hyper(0.1)}).fields()
    assert "closure" not in fields
    assert list(fields) == ["task", "step", "pull", "ends_step", "hyper"]
    assert PushRequest.decode(fields).closure is None


def test_every_op_has_a_request_and_a_reply_type():
    assert set(REQUEST_TYPES) == set(Op) == set(REPLY_TYPES)
    for op, kind in REQUEST_TYPES.items():
        assert kind.op is op


@pytest.mark.parametrize("kind, fields, field", [
    (PushRequest, {"step": 1}, "task"),
    (PushRequest, {"task": "w" * 65, "step": 1}, "task"),
    (PushRequest, {"task": "worker:0", "step": -1}, "step"),
    (PushRequest, {"task": "worker:0", "step": True}, "step"),
    (PushRequest, {"task": "worker:0", "step": 1, "pull": "yes"}, "pull"),
    (PushRequest, {"task": "worker:0", "step": 1, "hyper": [0.1, 0.0]}, "hyper"),
    (PushRequest, {"task": "worker:0", "step": 1, "hyper": {"w": [0.1]}}, "hyper"),
    (PushRequest, {"task": "worker:0", "step": 1, "hyper": {"w": [-0.1, 0.0]}}, "hyper"),
    (PushRequest, {"task": "worker:0", "step": 1, "hyper": {"w": [float("nan"), 0.0]}}, "hyper"),
    (PushRequest, {"task": "worker:0", "step": 1, "hyper": {"w": [0.1, True]}}, "hyper"),
    (PushRequest, {"task": "worker:0", "step": 1, "closure": "3f2a.17"}, "closure"),
    (PushRequest, {"task": "worker:0", "step": 1, "closure": ["", 0]}, "closure"),
    (PushRequest, {"task": "worker:0", "step": 1, "closure": ["c" * 65, 0]}, "closure"),
    (PushRequest, {"task": "worker:0", "step": 1, "closure": ["3f2a.17", -1]}, "closure"),
    (PushRequest, {"task": "worker:0", "step": 1, "closure": ["3f2a.17", True]}, "closure"),
    (PullRequest, {"min_step": 0}, "names"),
    (PullRequest, {"names": ["W", 3]}, "names"),
    (InitRequest, {"rule": {"name": "sgd"}, "mode": "sometimes"}, "mode"),
    (InitRequest, {"rule": {"name": "sgd"}, "mode": "sync"}, "sync_replicas"),
    (InitRequest, {"rule": {"name": "sgd"}, "mode": "async", "sync_replicas": 2}, "sync_replicas"),
    (InitRequest, {"rule": "sgd", "mode": "async"}, "rule"),
    (InitRequest, {"rule": {}, "mode": "async", "done": "worker:0"}, "done"),
    (StatusReply, {"phase": "ready", "mode": "async", "step": 1, "shards": 1, "bytes": 4, "created": 1,
                   "done": []}, "incarnation"),
    (StatusReply, {"phase": "sleeping"}, "phase"),
    (PushReply, {"step": 3, "outcome": "lost"}, "outcome"),
    (PullReply, {}, "step"),
    (DoneRequest, {"task": None}, "task"),
    (HeartbeatRequest, {"task": "worker:0", "incarnation": "a", "timeout_ms": 3_600_001}, "timeout_ms"),
    (HeartbeatRequest, {"task": "worker:0", "incarnation": "a", "timeout_ms": 0}, "timeout_ms"),
    (HeartbeatRequest, {"task": "worker:0", "incarnation": "a", "timeout_ms": 9, "answer": "x" * 65}, "answer"),
    (HeartbeatReply, {"version": 2, "joined": False, "members": 1, "challenge": 7}, "challenge"),
])
def test_bad_or_missing_field_names_the_field(kind, fields, field):
    with pytest.raises(ProtocolFieldError, match=rf"field '{field}' must be"):
        kind.decode(fields)


def test_unknown_op_names_the_ops_this_ps_speaks():
    with pytest.raises(PsError, match=r"unknown op 'launch_missiles'; this ps speaks status, init"):
        parse_op("launch_missiles")


def test_training_mode_needs_replicas_exactly_in_sync_mode():
    with pytest.raises(PsError):
        TrainingMode(Mode.SYNC)
    with pytest.raises(PsError):
        TrainingMode(Mode.ASYNC, 2)
    assert str(SYNC2) == "sync (2 replicas per step)" and str(ASYNC) == "async"


def test_slot_tensors_are_split_from_values():
    values, slots = split_slots({"W": 1, "W@m": 2, "W@v": 3, "b/part_0@accum": 4})
    assert values == {"W": 1} and slots == {"W": {"m": 2, "v": 3}, "b/part_0": {"accum": 4}}


def test_the_longest_heartbeat_timeout_on_the_wire_is_the_memberships():
    assert MAX_HEARTBEAT_TIMEOUT_MS == MAX_TIMEOUT_S * 1000


def test_a_push_with_leased_positions_roundtrips_as_tuples():
    ranges = ((4, 0, 100), (5, 200, 300), (_MAX_ID, _MAX_ID - 1, _MAX_ID))  # (the largest ids and positions too)
    push = PushRequest("worker:0", 3, used=UsedPositions("book1", ranges))
    decoded = PushRequest.decode(push.fields())
    assert decoded == push and decoded.used.ranges == ranges


@pytest.mark.parametrize("ranges", [
    [[4, 100, 100]], [[4, 200, 100]], [[4, -1, 100]], [[-4, 0, 100]], [[True, 0, 100]], [[4, 0, True]],
    [[4, 0.0, 100]], [[4, 0]], [[4, 0, 100, 1]], [(4, 0, 100)], ["4,0,100"], [[4, 0, 1 << 62]],
    [], [[4, k, k + 1] for k in range(MAX_USED_RANGES + 1)],
], ids=lambda ranges: repr(ranges)[:32])
def test_malformed_leased_positions_are_refused_naming_the_field(ranges):
    with pytest.raises(ProtocolFieldError, match="push request: field 'used' must be"):
        PushRequest.decode({"task": "worker:0", "step": 1, "used": {"book": "book1", "ranges": ranges}})
