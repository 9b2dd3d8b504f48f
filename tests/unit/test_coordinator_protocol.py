"""The coordinator <-> worker protocol: every field validated, values round-trip, nothing
executable travels, and a worker's executor refuses bad requests without stopping."""

import numpy as np
import pytest

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.ps.protocol import ClosureTag
from shoal.train.closure_tags import ClosureTags
from shoal.train.coordinator_errors import BadValueError, CoordinatorError, UnknownStepError
from shoal.train.coordinator_executor import StepExecutor, worker_context
from shoal.train.coordinator_protocol import (CoordinatorFieldError, HelloReply, RunOutcome, RunReply, RunRequest,
                                              parse_op)
from shoal.train.coordinator_registry import StepRegistry
from shoal.train.coordinator_values import DatasetRef, decode_values, encode_values
from shoal.wire import decode, encode

SPEC = ClusterSpec.from_dict({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
                              "ps": ["127.0.0.1:4"]})


def through_the_wire(fields, tensors):
    """What the other side decodes: the header and tensors after encode + decode."""
    message = decode(encode(dict(fields, op="run", rid=1), tensors))
    return message.header, message.tensors


def test_values_round_trip_tensors_and_plain_values_through_the_wire():
    value = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": 3, "f": 0.5, "s": "a", "none": None,
             "flag": True, "pair": (1, [2.0, np.int64(7)]), "scalar": np.float32(1.5)}
    tree, tensors = encode_values(value)
    header, got_tensors = through_the_wire({"args": tree}, tensors)
    got = decode_values(header["args"], got_tensors)
    np.testing.assert_array_equal(got["x"], value["x"])
    assert got["pair"] == (1, [2.0, 7]) and isinstance(got["pair"], tuple)
    assert (got["n"], got["f"], got["s"], got["none"], got["flag"], got["scalar"]) == (3, 0.5, "a", None, True, 1.5)


def test_encode_values_refuses_a_function_naming_where_it_is():
    with pytest.raises(BadValueError, match=r"value\[1\] is a function, which cannot be sent"):
        encode_values([1, lambda: 0])


def test_encode_values_refuses_a_dict_with_a_non_string_key():
    with pytest.raises(BadValueError, match="dict keys must be strings"):
        encode_values({1: 2})


@pytest.mark.parametrize("tree, match", [
    (["x", 1], "unknown value tag"),
    (["i", "1"], "does not fit tag 'i'"),
    (["t", "missing"], "not among the message's tensors"),
    (["l", [["i", 1], "junk"]], r"value\[1\]: a value must be \[tag, payload\]"),
    (["D", -1], "dataset reference must be an int"),
])
def test_decode_values_refuses_a_malformed_tree_naming_the_node(tree, match):
    with pytest.raises(BadValueError, match=match):
        decode_values(tree, {})


def test_decode_values_resolves_dataset_references_on_the_worker():
    tree, _ = encode_values([DatasetRef(4)])
    assert decode_values(tree, {}, dataset=lambda i: f"iterator {i}") == ["iterator 4"]


def test_run_request_round_trips_its_fields():
    request = RunRequest(7, "train", 10, ["l", []])
    assert RunRequest.decode(request.fields()) == request
    tagged = RunRequest(7, "train", 10, ["l", []], origin="a1b2c3")
    assert RunRequest.decode(tagged.fields()) == tagged and tagged.closure_key == "a1b2c3.7"


class TaggingSession:
    """The part of a TrainingSession the executor uses to tag pushes: `closure`, with a real
    ClosureTags; `push` records the tag each push would carry."""

    def __init__(self):
        self.tags = ClosureTags()
        self.closure = self.tags.running
        self.pushed = []

    def push(self):
        self.pushed.append(self.tags.next_tag())


def test_executor_tags_every_push_of_a_closure_with_its_id_and_index_and_none_outside():
    registry = StepRegistry()
    registry.step(lambda ctx: ctx.session.push(), name="train")
    session = TaggingSession()
    executor = StepExecutor(worker_context(ClusterConfig(SPEC, TaskId("worker", 1)), session), registry)
    executor.handle("run", RunRequest(5, "train", 3, ["l", []], origin="c0ffee").fields(), {})
    executor.handle("run", RunRequest(6, "train", 1, ["l", []], origin="c0ffee").fields(), {})
    assert session.pushed == [ClosureTag("c0ffee.5", 0), ClosureTag("c0ffee.5", 1), ClosureTag("c0ffee.5", 2),
                              ClosureTag("c0ffee.6", 0)]
    session.push()  # outside a closure: untagged, as in between-graph training
    assert session.pushed[-1] is None


@pytest.mark.parametrize("fields, field", [
    ({"fn": "train", "steps": 1, "args": ["l", []]}, "closure"),
    ({"closure": 1, "fn": "", "steps": 1, "args": ["l", []]}, "fn"),
    ({"closure": 1, "fn": "train", "steps": 0, "args": ["l", []]}, "steps"),
    ({"closure": 1, "fn": "train", "steps": True, "args": ["l", []]}, "steps"),
    ({"closure": 1, "fn": "train", "steps": (1 << 20) + 1, "args": ["l", []]}, "steps"),
    ({"closure": 1, "fn": "train", "args": ["l", []]}, "steps"),
    ({"closure": 1, "fn": "train", "steps": 1, "args": "x"}, "args"),
    ({"closure": 1, "fn": "train", "steps": 1, "args": ["l", []], "origin": 5}, "origin"),
])
def test_run_request_with_a_bad_field_names_the_op_and_the_field(fields, field):
    with pytest.raises(CoordinatorFieldError, match=f"run request: field {field!r}"):
        RunRequest.decode(fields)


def test_run_reply_raised_needs_the_error_line():
    with pytest.raises(CoordinatorFieldError, match="run reply: field 'error'"):
        RunReply.decode({"outcome": "raised", "error": "", "traceback": ""})
    with pytest.raises(CoordinatorFieldError, match="run reply: field 'outcome'"):
        RunReply.decode({"outcome": "maybe"})


def test_hello_reply_refuses_held_ids_that_are_not_ints():
    with pytest.raises(CoordinatorFieldError, match="field 'held'"):
        HelloReply.decode({"task": "worker:0", "steps": [], "datasets": [], "held": ["a"]})


def test_unknown_op_lists_the_ops_a_worker_speaks():
    with pytest.raises(CoordinatorFieldError, match="hello, dataset, run, finish"):
        parse_op("exec")


def make_executor(registry: StepRegistry) -> StepExecutor:
    return StepExecutor(worker_context(ClusterConfig(SPEC, TaskId("worker", 1)), None), registry)


def test_executor_refuses_an_unregistered_step_and_keeps_serving():
    registry = StepRegistry()
    registry.step(lambda ctx, x: x * 2, name="double")
    executor = make_executor(registry)
    with pytest.raises(UnknownStepError, match="no step named 'nope' is registered \\(registered steps: double\\)"):
        executor.handle("run", RunRequest(1, "nope", 1, ["l", []]).fields(), {})
    out = executor.handle("run", RunRequest(2, "double", 1, encode_values([21])[0]).fields(), {})
    assert out.body.outcome is RunOutcome.RETURNED and decode_values(out.body.value, out.tensors or {}) == 42


def test_executor_refuses_arguments_that_are_not_a_list():
    registry = StepRegistry()
    registry.step(lambda ctx: 0, name="zero")
    with pytest.raises(BadValueError, match="step args must be a list"):
        make_executor(registry).handle("run", RunRequest(1, "zero", 1, ["i", 3]).fields(), {})


def test_executor_reports_a_raising_step_with_the_tracebacks_last_line():
    registry = StepRegistry()

    @registry.step
    def boom(ctx, n):
        raise ValueError(f"bad batch {n}")

    out = make_executor(registry).handle("run", RunRequest(1, "boom", 3, encode_values([5])[0]).fields(), {})
    assert out.body.outcome is RunOutcome.RAISED
    assert out.body.error == "ValueError: bad batch 5"
    assert "in boom" in out.body.traceback


def test_executor_runs_a_step_k_times_and_returns_the_last_result():
    registry = StepRegistry()
    calls = []

    @registry.step
    def count(ctx):
        calls.append(ctx.task)
        return len(calls)

    out = make_executor(registry).handle("run", RunRequest(1, "count", 4, ["l", []]).fields(), {})
    assert decode_values(out.body.value, {}) == 4 and calls == ["worker:1"] * 4


def test_executor_step_using_a_dataset_it_never_created_is_refused():
    registry = StepRegistry()
    registry.step(lambda ctx, it: next(it), name="take")
    tree, _ = encode_values([DatasetRef(0)])
    with pytest.raises(CoordinatorError, match="has no dataset 0"):
        make_executor(registry).handle("run", RunRequest(1, "take", 1, tree).fields(), {})


def test_executor_datasets_are_per_worker_and_reported_in_hello():
    registry = StepRegistry()
    registry.dataset(lambda ctx, n: iter(range(ctx.shard_index, n, ctx.num_shards)), name="numbers")
    registry.step(lambda ctx, it: next(it), name="take")
    executor = make_executor(registry)
    executor.handle("dataset", {"id": 3, "fn": "numbers", "args": encode_values([10])[0]}, {})
    assert executor.handle("hello", {}, {}).body.held == (3,)
    tree, _ = encode_values([DatasetRef(3)])
    values = [decode_values(executor.handle("run", RunRequest(i, "take", 1, tree).fields(), {}).body.value, {})
              for i in range(3)]
    assert values == [1, 3, 5]  # worker:1 is shard 1 of 2 (the chief coordinates)


def test_the_chief_does_not_serve_steps():
    with pytest.raises(CoordinatorError, match="chief:0 does not execute steps"):
        worker_context(ClusterConfig(SPEC, TaskId("chief", 0)), None)


def test_registry_refuses_two_steps_with_one_name():
    registry = StepRegistry()
    registry.step(lambda ctx: 0, name="a")
    with pytest.raises(CoordinatorError, match="a step named 'a' is already registered"):
        registry.step(lambda ctx: 1, name="a")
