"""The coordinator <-> worker protocol of in-graph training: a closed set of ops, one typed
request and reply per op, on the same wire as the ps (msgpack header + raw tensor frames,
authenticated with the job secret).

    hello    the coordinator asks who a worker is and what it has registered
    dataset  create per-worker dataset `id` from a registered dataset function
    run      run a registered step `steps` times in a row (its pushes tagged with the closure's
             id, so the ps applies them once); the reply carries the last result,
             or the remote error (outcome RAISED) with the traceback's last line
    finish   training is over: the worker closes its session and exits

Arguments and results are tagged value trees (shoal/train/coordinator_values.py) with their
tensors beside the header. Every `decode` checks every field and raises `CoordinatorFieldError`
naming the op and the field. Pure data and validation: no I/O; immutable, thread-safe.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from shoal.train.coordinator_errors import CoordinatorError
from shoal.train.coordinator_registry import MAX_NAME
from shoal.wire.fields import FieldReaders

MAX_STEPS_PER_RUN = 1 << 20
MAX_ERROR_CHARS = 8192
MAX_ORIGIN = 32


class CoordinatorFieldError(CoordinatorError):
    """A request or reply field is missing or has the wrong type or value."""


class CoordOp(str, Enum):
    """Every request a worker's step service understands."""

    HELLO = "hello"
    DATASET = "dataset"
    RUN = "run"
    FINISH = "finish"


class RunOutcome(str, Enum):
    """How a run ended: the step returned (every time), or raised (the rest were not run)."""

    RETURNED = "returned"
    RAISED = "raised"


_read = FieldReaders(CoordinatorFieldError)
_fail = _read.fail
_int = functools.partial(_read.int, maximum=1 << 62)
_str = _read.str
_names = functools.partial(_read.names, max_len=MAX_NAME, required=True)


def _tree(fields: Mapping[str, Any], where: str, key: str) -> list:
    value = fields.get(key)
    if not isinstance(value, list) or len(value) != 2:
        raise _fail(where, key, "a value tree [tag, payload]", value)
    return value


@dataclass(frozen=True)
class HelloRequest:
    op = CoordOp.HELLO

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "HelloRequest":
        return cls()


@dataclass(frozen=True)
class HelloReply:
    """Who the worker is, the names its registry holds (the coordinator checks they match) and
    the ids of the per-worker datasets it holds (a restarted worker holds none: the coordinator
    creates them again)."""

    task: str
    steps: tuple[str, ...]
    datasets: tuple[str, ...]
    held: tuple[int, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"task": self.task, "steps": list(self.steps), "datasets": list(self.datasets),
                "held": list(self.held)}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "HelloReply":
        where = "hello reply"
        held = fields.get("held")
        if not isinstance(held, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                 for i in held):
            raise _fail(where, "held", "a list of dataset ids", held)
        return cls(_str(fields, where, "task", 64), _names(fields, where, "steps"), _names(fields, where, "datasets"),
                   tuple(held))


@dataclass(frozen=True)
class DatasetRequest:
    """Travels with the tensors `args` refers to."""

    op = CoordOp.DATASET
    dataset_id: int
    fn: str
    args: list

    def fields(self) -> dict[str, Any]:
        return {"id": self.dataset_id, "fn": self.fn, "args": self.args}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "DatasetRequest":
        where = "dataset request"
        return cls(_int(fields, where, "id"), _str(fields, where, "fn", MAX_NAME), _tree(fields, where, "args"))


@dataclass(frozen=True)
class RunRequest:
    """Run step `fn` `steps` times with `args` (travels with their tensors). `closure` is the
    coordinator's id of this scheduled call; a re-scheduled call keeps its id. `origin` is the
    coordinator's random id (a restarted coordinator has another), "" if not sent; with
    `closure` it names the call for the ps (`closure_key`), which applies its pushes once."""

    op = CoordOp.RUN
    closure: int
    fn: str
    steps: int
    args: list
    origin: str = ""

    @property
    def closure_key(self) -> str:
        """The id the worker's pushes carry: "<origin>.<closure>" (or "<closure>")."""
        return f"{self.origin}.{self.closure}" if self.origin else str(self.closure)

    def fields(self) -> dict[str, Any]:
        return {"closure": self.closure, "fn": self.fn, "steps": self.steps, "args": self.args,
                "origin": self.origin}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "RunRequest":
        where = "run request"
        origin = _str(fields, where, "origin", MAX_ORIGIN, allow_empty=True) if "origin" in fields else ""
        return cls(_int(fields, where, "closure"), _str(fields, where, "fn", MAX_NAME),
                   _int(fields, where, "steps", 1, maximum=MAX_STEPS_PER_RUN), _tree(fields, where, "args"), origin)


@dataclass(frozen=True)
class RunReply:
    """RETURNED: `value` is the last run's result (travels with its tensors). RAISED: `error` is
    the remote traceback's last line and `traceback` all of it (both bounded)."""

    outcome: RunOutcome
    value: list | None = None
    error: str = ""
    traceback: str = ""

    def fields(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "value": self.value, "error": self.error[-MAX_ERROR_CHARS:],
                "traceback": self.traceback[-MAX_ERROR_CHARS:]}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "RunReply":
        where = "run reply"
        try:
            outcome = RunOutcome(fields.get("outcome"))
        except ValueError:
            raise _fail(where, "outcome", "returned or raised", fields.get("outcome")) from None
        if outcome is RunOutcome.RETURNED:
            return cls(outcome, _tree(fields, where, "value"))
        return cls(outcome, None, _str(fields, where, "error", MAX_ERROR_CHARS),
                   _str(fields, where, "traceback", MAX_ERROR_CHARS, allow_empty=True))


@dataclass(frozen=True)
class FinishRequest:
    op = CoordOp.FINISH

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "FinishRequest":
        return cls()


@dataclass(frozen=True)
class Empty:
    """The reply of ops that answer nothing but success (dataset, finish)."""

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "Empty":
        return cls()


REQUEST_TYPES: dict[CoordOp, type] = {CoordOp.HELLO: HelloRequest, CoordOp.DATASET: DatasetRequest,
                                      CoordOp.RUN: RunRequest, CoordOp.FINISH: FinishRequest}
REPLY_TYPES: dict[CoordOp, type] = {CoordOp.HELLO: HelloReply, CoordOp.DATASET: Empty, CoordOp.RUN: RunReply,
                                    CoordOp.FINISH: Empty}


def parse_op(value: Any) -> CoordOp:
    """The CoordOp named `value`; CoordinatorFieldError naming the ops a worker speaks if none."""
    try:
        return CoordOp(value)
    except ValueError:
        raise CoordinatorFieldError(f"unknown op {value!r:.50}; a worker's step service speaks "
                                    f"{', '.join(op.value for op in CoordOp)} (is the peer a Shoal coordinator "
                                    "of the same version?)") from None
