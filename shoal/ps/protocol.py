"""The parameter-server protocol: the closed set of ops, and one typed request and reply per op.

Both sides use these types: a worker builds a request and decodes the reply with them, a ps
decodes the request and builds the reply. Every `decode` checks every field it reads and raises
`ProtocolFieldError` naming the op, the field and what was wrong, so no handler ever reads an
unchecked field. Tensors travel beside the header fields (see docs/wire-protocol.md), never
inside these types.

Ops to come go into `Op` with their own pair of types (sparse rows: pull and push of embedding
rows).

Pure data and validation: no I/O; every type is immutable and thread-safe.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from shoal.ps.errors import PsError
from shoal.wire.fields import FieldReaders
from shoal.ps.sync_wait import SyncWait

SLOT_SEPARATOR = "@"
"""A tensor named "<shard>@<slot>" is optimizer state of that shard (Adam's m, v, t, ...)."""

MAX_TASK_NAME = 64


class Op(str, Enum):
    """Every request a parameter server understands."""

    STATUS = "status"        # what the ps holds and where it is
    INIT = "init"            # create shards (chief; also restores a checkpoint or rebuilds a ps)
    SNAPSHOT = "snapshot"    # consistent copies of values and optimizer state (checkpoints)
    READY = "ready"          # the chief finished initializing: workers may train
    PULL = "pull"            # current values, once the ps reached a step
    PUSH = "push"            # apply gradients; the reply carries the new values
    DONE = "done"            # a training replica finished; the job ends when every one did
    FAILED = "failed"        # a training replica left by an error (it may be restarted)
    SHUTDOWN = "shutdown"    # end the job now
    HEARTBEAT = "heartbeat"  # a training replica is alive (and a member: it joins with its first)
    LEASE = "lease"          # ps 0: a range of positions of the training set to train on (dynamic sharding)
    REPLICATE = "replicate"  # ps k -> ps k+1: hold this copy of my shards (shoal/ps/replicas.py)
    REPLICA = "replica"      # the copy of ps k's shards this ps holds (the chief rebuilds a restarted ps)
    ADOPT = "adopt"          # take over shards of a ps that never came back (re-homing: shoal/ps/adoption.py)
    JOIN = "join"            # ps k > 0 -> ps 0: I serve at this address (a ps added to a running job registers)
    RELEASE = "release"      # stop serving these shards and hand them over (they move to a ps that joined)
    PLACE = "place"          # the job's placement history (re-homings and joins), reported in `status`


class Mode(str, Enum):
    """How a ps applies gradients: each at once (ASYNC) or averaged per global step (SYNC)."""

    ASYNC = "async"
    SYNC = "sync"


class Phase(str, Enum):
    """Where a ps is in its life. EMPTY -> CREATED (first `init`) -> READY (`ready`); a ps that
    restarts starts EMPTY again and is rebuilt by the chief."""

    EMPTY = "empty"
    CREATED = "created"
    READY = "ready"


class PushOutcome(str, Enum):
    """What happened to one worker's push."""

    APPLIED = "applied"           # applied (async), or it completed or joined an applied step (sync)
    ACCUMULATED = "accumulated"   # sync, ps-internal: counted; its reply waits for the step to finish
    STALE = "stale"               # sync: computed at an old step, dropped (backup workers cause this)
    DUPLICATE = "duplicate"       # sync: this task already contributed to the current step, dropped;
    #                               or its closure tag's push was already applied (a re-run closure), dropped
    ROLLED_BACK = "rolled_back"   # async: computed on values of an earlier process of this ps (a failover
                                  # rolled them back), dropped; the reply carries the restored values
    MOVED = "moved"               # some of its shards moved to a ps that joined (`release`): the part was not
                                  # applied nor counted (`moved` names them); send it again by the new placement


@dataclass(frozen=True)
class TrainingMode:
    """The mode a job trains in; `replicas` is the gradients per step in SYNC mode, else None."""

    mode: Mode
    replicas: int | None = None

    def __post_init__(self) -> None:
        if (self.mode is Mode.SYNC) != (self.replicas is not None):
            raise PsError(f"{self.mode.value} training takes replicas only in sync mode, got {self.replicas!r}")

    def __str__(self) -> str:
        return f"sync ({self.replicas} replicas per step)" if self.replicas else "async"


ASYNC = TrainingMode(Mode.ASYNC)


@dataclass(frozen=True)
class Hyper:
    """The learning rate and weight decay one push applies to one shard (a PyTorch param
    group's, read at every step), in place of its update rule's own."""

    learning_rate: float
    weight_decay: float = 0.0


class LeaseState(str, Enum):
    """What a lease request got: a range (GRANTED); nothing now, because every free position is
    leased or waits in a sync step that may still give some back (WAIT: ask again soon); or
    nothing ever, because every epoch before the request's `until_epoch` is consumed (EXHAUSTED)."""

    GRANTED = "granted"
    WAIT = "wait"
    EXHAUSTED = "exhausted"


MAX_EXAMPLES = 1 << 48
"""The largest training set the lease service counts positions of."""
MAX_USED_RANGES = 256
"""The most position ranges one push may name in `used`."""
_MAX_ID = (1 << 62) - 1


class ProtocolFieldError(PsError):
    """A request or reply field is missing or has the wrong type or value."""


# --- field readers: each returns the checked value or raises ProtocolFieldError -------------

_read = FieldReaders(ProtocolFieldError)
_fail, _int, _optional_int, _bool, _str = _read.fail, _read.int, _read.optional_int, _read.bool, _read.str


_TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+:[0-9]+")


def _task(fields: Mapping[str, Any], where: str) -> str:
    value = fields.get("task")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TASK_NAME or not _TASK_NAME.fullmatch(value):
        raise _fail(where, "task", "the sending task's name, <job>:<index> (e.g. 'worker:1')", value)
    return value


_names = _read.names


def _enum(enum: type, fields: Mapping[str, Any], where: str, key: str):
    value = fields.get(key)
    if type(value) is str:  # the wire's form: a plain dict lookup (calling the Enum costs more)
        member = _members(enum).get(value)
        if member is not None:
            return member
    raise _fail(where, key, f"one of {', '.join(e.value for e in enum)}", value)


_MEMBERS: dict[type, dict[str, Enum]] = {}


def _members(enum: type) -> dict[str, Enum]:
    """The members of a str-valued Enum by value (built once per Enum; thread-safe: a race
    builds the same dict twice)."""
    members = _MEMBERS.get(enum)
    if members is None:
        members = _MEMBERS[enum] = {e.value: e for e in enum}
    return members


def _map(fields: Mapping[str, Any], where: str, key: str) -> dict:
    value = fields.get(key)
    if not isinstance(value, dict):
        raise _fail(where, key, "a map", value)
    return value


def _hyper(fields: Mapping[str, Any], where: str, key: str) -> dict[str, Hyper] | None:
    value = fields.get(key)
    if value is None:
        return None
    want = "nil or a map of shard name -> [learning rate, weight decay], finite numbers >= 0"
    if not isinstance(value, dict):
        raise _fail(where, key, want, value)
    out = {}
    made: dict[tuple, Hyper] = {}  # the shards of a push share their group's pair: one Hyper per pair
    for name, pair in value.items():
        if not (isinstance(name, str) and 0 < len(name) <= 512 and isinstance(pair, list) and len(pair) == 2
                and _is_rate(pair[0]) and _is_rate(pair[1])):
            raise _fail(where, key, want, {name: pair})
        pair = (pair[0], pair[1])
        hyper = made.get(pair)
        if hyper is None:
            hyper = made[pair] = Hyper(float(pair[0]), float(pair[1]))
        out[name] = hyper
    return out


def _is_rate(x: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    if type(x) is float:  # what msgpack gives for a learning rate: checked without isinstance chains
        return 0.0 <= x < math.inf
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _training_mode(fields: Mapping[str, Any], where: str) -> TrainingMode:
    mode = _enum(Mode, fields, where, "mode")
    replicas = _optional_int(fields, where, "sync_replicas", 1)
    if (mode is Mode.SYNC) != (replicas is not None):
        raise _fail(where, "sync_replicas", "an int >= 1 in sync mode and nil in async mode", replicas)
    return TrainingMode(mode, replicas)


def _mode_fields(training: TrainingMode) -> dict[str, Any]:
    return {"mode": training.mode.value, "sync_replicas": training.replicas}


def _optional_map(fields: Mapping[str, Any], where: str, key: str) -> dict | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, dict):
        raise _fail(where, key, "nil or a map", value)
    return value


def _optional_str(fields: Mapping[str, Any], where: str, key: str, max_len: int) -> str:
    """A string of at most `max_len` characters; "" when missing."""
    return _str(fields, where, key, max_len, allow_empty=True) if key in fields else ""


def _is_count(value: Any, maximum: int = _MAX_ID) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum


MAX_PS = 1 << 16
"""The most ps tasks a job may have (bounds ps index lists on the wire)."""


def _indices(fields: Mapping[str, Any], where: str, key: str) -> tuple[int, ...]:
    """A list of distinct ps indices (absent: empty), in its order."""
    value = fields.get(key, [])
    if not (isinstance(value, list) and len(value) <= MAX_PS and all(_is_count(v, MAX_PS - 1) for v in value)
            and len(set(value)) == len(value)):
        raise _fail(where, key, f"a list of distinct ps indices (ints 0..{MAX_PS - 1})", value)
    return tuple(value)


@dataclass(frozen=True)
class UsedPositions:
    """The positions of the training set one gradient was computed on: ranges [start, end) of
    leases issued by the lease book `book` (ps 0's incarnation). Travels in a push to ps 0."""

    book: str
    ranges: tuple[tuple[int, int, int], ...]  # (lease, start, end)

    @property
    def count(self) -> int:
        return sum(end - start for _, start, end in self.ranges)

    def fields(self) -> dict[str, Any]:
        return {"book": self.book, "ranges": [list(r) for r in self.ranges]}

    @classmethod
    def decode(cls, value: Any, where: str) -> "UsedPositions":
        want = (f"nil or a map {{book: ps 0's lease book id, ranges: 1 to {MAX_USED_RANGES} "
                f"[lease, start, end] with 0 <= start < end}}")
        if not isinstance(value, dict) or not isinstance(value.get("book"), str) or not 0 < len(value["book"]) <= 64:
            raise _fail(where, "used", want, value)
        ranges = value.get("ranges")
        if not isinstance(ranges, list) or not 0 < len(ranges) <= MAX_USED_RANGES:
            raise _fail(where, "used", want, value)
        checked = []
        for r in ranges:  # (every push to ps 0 passes here: exact types, as msgpack gives them, and no calls)
            if not (type(r) is list and len(r) == 3 and type(r[0]) is int and type(r[1]) is int
                    and type(r[2]) is int and 0 <= r[0] <= _MAX_ID and 0 <= r[1] < r[2] <= _MAX_ID):
                raise _fail(where, "used", want + f"; bad range {r!r:.60}", value)
            checked.append((r[0], r[1], r[2]))
        return cls(value["book"], tuple(checked))


MAX_CLOSURE_ID = 64
"""The longest closure id a push may carry."""


@dataclass(frozen=True)
class ClosureTag:
    """Which scheduled closure (in-graph training, docs/coordinator.md) a push belongs to:
    `closure` is the coordinator's id of it (the same when it is re-run on another worker) and
    `push` the index of this push among the closure's pushes (0, 1, ...). A ps applies each
    (closure, push) once; on the wire `"closure": [closure, push]`."""

    closure: str
    push: int

    def fields(self) -> list:
        return [self.closure, self.push]

    @classmethod
    def decode(cls, value: Any, where: str) -> "ClosureTag":
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and 0 < len(value[0]) <= MAX_CLOSURE_ID and _is_count(value[1])):
            raise _fail(where, "closure", f"nil or [closure id (1 to {MAX_CLOSURE_ID} characters), push index >= 0]",
                        value)
        return cls(value[0], value[1])

    def __str__(self) -> str:
        return f"closure {self.closure} push {self.push}"


@dataclass(frozen=True)
class LeaseCounts:
    """Where ps 0's lease book is: the oldest epoch not yet consumed and its positions consumed
    (by an applied gradient, each once), leased (handed out, not yet used), pending (in a sync
    step not yet applied), requeued (given back to the queue: released, stale, given up; a
    position can be requeued more than once) and lost (see docs/dynamic-sharding.md), and how many
    epochs were completed."""

    num_examples: int
    epoch: int
    consumed: int
    leased: int
    pending: int
    requeued: int
    lost: int
    completed: int

    def fields(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def decode(cls, value: Any, where: str, key: str) -> "LeaseCounts | None":
        if value is None:
            return None
        names = list(cls.__dataclass_fields__)
        if not isinstance(value, dict) or not all(_is_count(value.get(n)) for n in names):
            raise _fail(where, key, f"nil or a map of {', '.join(names)} (ints >= 0)", value)
        return cls(**{n: value[n] for n in names})


# --- one request and one reply type per op ---------------------------------------------------

@dataclass(frozen=True)
class StatusRequest:
    op = Op.STATUS

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "StatusRequest":
        return cls()


@dataclass(frozen=True)
class StatusReply:
    """`training` is None while the ps is EMPTY. `incarnation` is random per ps process, so a
    worker can tell a restarted ps from a network blip. In sync mode, `sync_have` names the
    replicas whose gradient for the current step arrived, `sync_needed` how many more the step
    needs and `sync_missing` the replicas that have not pushed for it (see `sync_wait`); a ps
    that predates these fields sends none, read as empty. `members` are the replicas the ps
    counts as training (shoal/ps/membership.py), under `membership_version` (0: a ps without
    membership)."""

    phase: Phase
    training: TrainingMode | None
    step: int
    shards: int
    nbytes: int
    created: int
    done: tuple[str, ...]
    incarnation: str
    sync_have: tuple[str, ...] = ()
    sync_needed: int = 0
    sync_missing: tuple[str, ...] = ()
    membership_version: int = 0
    members: tuple[str, ...] = ()
    leases: LeaseCounts | None = None  # ps 0, once a worker leased positions or a checkpoint restored some
    retired: tuple[int, ...] = ()  # the ps tasks whose shards were re-homed, in that order (learned by `adopt`)
    joined: tuple[JoinedPs, ...] = ()  # ps 0: the ps tasks that registered with `join`, by index
    history: tuple[PlacementChange, ...] = ()  # the placement's changes so far (`place`, `adopt`), in order

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def sync_wait(self) -> SyncWait | None:
        """What the current sync step waits for; None in async mode or before `init`."""
        if self.training is None or self.training.mode is not Mode.SYNC:
            return None
        return SyncWait(self.step, self.sync_have, self.sync_needed, self.sync_missing, self.done)

    def fields(self) -> dict[str, Any]:
        mode = _mode_fields(self.training) if self.training else {"mode": None, "sync_replicas": None}
        return {"phase": self.phase.value, **mode, "step": self.step, "shards": self.shards, "bytes": self.nbytes,
                "created": self.created, "done": list(self.done), "incarnation": self.incarnation,
                "sync_have": list(self.sync_have), "sync_needed": self.sync_needed,
                "sync_missing": list(self.sync_missing), "membership_version": self.membership_version,
                "members": list(self.members), "retired": list(self.retired),
                **({"leases": self.leases.fields()} if self.leases is not None else {}),
                **({"joined": [j.fields() for j in self.joined]} if self.joined else {}),
                **({"history": [c.fields() for c in self.history]} if self.history else {})}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "StatusReply":
        where = "status reply"
        phase = _enum(Phase, fields, where, "phase")
        training = None if phase is Phase.EMPTY else _training_mode(fields, where)
        return cls(phase, training, _int(fields, where, "step"), _int(fields, where, "shards"),
                   _int(fields, where, "bytes"), _int(fields, where, "created"),
                   _names(fields, where, "done", MAX_TASK_NAME), _str(fields, where, "incarnation", 64),
                   _names(fields, where, "sync_have", MAX_TASK_NAME), _int(fields, where, "sync_needed", default=0),
                   _names(fields, where, "sync_missing", MAX_TASK_NAME),
                   _int(fields, where, "membership_version", default=0), _names(fields, where, "members", MAX_TASK_NAME),
                   LeaseCounts.decode(fields.get("leases"), where, "leases"), _indices(fields, where, "retired"),
                   JoinedPs.decode_list(fields, where, "joined"), PlacementChange.decode_list(fields, where, "history"))


@dataclass(frozen=True)
class InitRequest:
    """Create the shards that travel with it (values, and "<shard>@<slot>" state), with this
    update rule and mode, starting at `step`, with the replicas in `done` already finished.
    `leases`, if not None, is the lease book's state from a checkpoint (ps 0 restores it; see
    shoal/ps/leases.py); absent when None. `members`, if not None, are the replicas the other
    ps tasks count as training (the chief rebuilding a restarted ps): the rebuilt ps expects
    those and not the ones that left meanwhile; absent when None."""

    op = Op.INIT
    rule: dict
    training: TrainingMode
    step: int = 0
    done: tuple[str, ...] = ()
    leases: dict | None = None
    members: tuple[str, ...] | None = None

    def fields(self) -> dict[str, Any]:
        fields = {"rule": self.rule, **_mode_fields(self.training), "step": self.step, "done": list(self.done)}
        if self.leases is not None:
            fields["leases"] = self.leases
        if self.members is not None:
            fields["members"] = list(self.members)
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "InitRequest":
        where = "init request"
        return cls(_map(fields, where, "rule"), _training_mode(fields, where), _int(fields, where, "step", default=0),
                   _names(fields, where, "done", MAX_TASK_NAME), _optional_map(fields, where, "leases"),
                   _names(fields, where, "members", MAX_TASK_NAME) if fields.get("members") is not None else None)


@dataclass(frozen=True)
class InitReply:
    created: int

    def fields(self) -> dict[str, Any]:
        return {"created": self.created}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "InitReply":
        return cls(_int(fields, "init reply", "created"))


@dataclass(frozen=True)
class SnapshotRequest:
    op = Op.SNAPSHOT

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "SnapshotRequest":
        return cls()


@dataclass(frozen=True)
class SnapshotReply:
    """Travels with copies of every shard and "<shard>@<slot>" state, all of one step. `leases`:
    ps 0's lease book state at the same moment (None from other ps, or with no book)."""

    step: int
    training: TrainingMode
    rule: dict
    leases: dict | None = None

    def fields(self) -> dict[str, Any]:
        fields = {"step": self.step, **_mode_fields(self.training), "rule": self.rule}
        if self.leases is not None:
            fields["leases"] = self.leases
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "SnapshotReply":
        where = "snapshot reply"
        return cls(_int(fields, where, "step"), _training_mode(fields, where), _map(fields, where, "rule"),
                   _optional_map(fields, where, "leases"))


@dataclass(frozen=True)
class ReadyRequest:
    op = Op.READY

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReadyRequest":
        return cls()


@dataclass(frozen=True)
class Empty:
    """The reply of ops that answer nothing but success (ready, shutdown)."""

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "Empty":
        return cls()


@dataclass(frozen=True)
class PullRequest:
    """The values of `names`, answered once the ps reached `min_step`."""

    op = Op.PULL
    names: tuple[str, ...]
    min_step: int = 0

    def fields(self) -> dict[str, Any]:
        return {"names": list(self.names), "min_step": self.min_step}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "PullRequest":
        where = "pull request"
        if not isinstance(fields.get("names"), list):
            raise _fail(where, "names", "a list of variable names", fields.get("names"))
        return cls(_names(fields, where, "names"), _int(fields, where, "min_step", default=0))


@dataclass(frozen=True)
class PullReply:
    """Travels with the values asked for. `incarnation` names the ps process whose values they
    are ("": not said); it is left out of equality (it names the process, not the answer)."""

    step: int
    incarnation: str = field(default="", compare=False)
    moved: tuple[str, ...] = ()  # asked-for shards this ps released (they moved to a ps that joined): no values

    def fields(self) -> dict[str, Any]:
        fields = _with_incarnation({"step": self.step}, self.incarnation)
        if self.moved:
            fields["moved"] = list(self.moved)
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "PullReply":
        where = "pull reply"
        return cls(_int(fields, where, "step"), _incarnation(fields, where), _names(fields, where, "moved"))


@dataclass(frozen=True)
class PushRequest:
    """Travels with one gradient per shard. `step` is the global step the gradient was computed
    at; with `pull` the reply carries the shards' new values. A push may travel in parts (one
    request per group of the ps's shards); `ends_step` marks the last part, the one an
    asynchronous ps counts as a step. `hyper`, if not None, names the learning rate and weight
    decay of every shard of this part (none other), used instead of the update rule's own (in
    sync mode: those of the push that completes the shard's step). `used`, if not None, names the
    leased positions the gradient was computed on; only the last part sent to ps 0 carries it,
    and ps 0 counts them by this part's outcome (docs/dynamic-sharding.md). `basis` is the
    incarnation of the ps process whose values the gradient was computed on ("": unknown); an
    asynchronous ps of another incarnation (restarted, its values rolled back by the failover)
    drops the part as ROLLED_BACK instead of applying it. `closure`, if not None, names the scheduled closure and push this gradient belongs to (every part of the push
    carries it): a ps that already applied those shards for that tag answers DUPLICATE with the
    current values instead of applying them again (shoal/ps/closure_ledger.py); absent when None.
    `empty` (sync only): the replica has no data for this step, and the gradients (zeros, sent
    by the placement as any push's) stand for none: the ps does not wait for them and does not
    average them in (shoal/ps/sync.py). Absent when False."""

    op = Op.PUSH
    task: str
    step: int
    pull: bool = True
    ends_step: bool = True
    hyper: Mapping[str, Hyper] | None = None
    used: UsedPositions | None = None
    basis: str = ""
    closure: ClosureTag | None = None
    empty: bool = False

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"task": self.task, "step": self.step, "pull": self.pull, "ends_step": self.ends_step}
        if self.empty:
            fields["empty"] = True
        if self.basis:
            fields["basis"] = self.basis
        if self.hyper is not None:
            fields["hyper"] = {n: [h.learning_rate, h.weight_decay] for n, h in self.hyper.items()}
        if self.used is not None:
            fields["used"] = self.used.fields()
        if self.closure is not None:
            fields["closure"] = self.closure.fields()
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "PushRequest":
        where = "push request"
        used, closure = fields.get("used"), fields.get("closure")
        return cls(_task(fields, where), _int(fields, where, "step", default=0), _bool(fields, where, "pull", True),
                   _bool(fields, where, "ends_step", True), _hyper(fields, where, "hyper"),
                   None if used is None else UsedPositions.decode(used, where),
                   _str(fields, where, "basis", 64, allow_empty=True) if "basis" in fields else "",
                   None if closure is None else ClosureTag.decode(closure, where), _bool(fields, where, "empty", False))


@dataclass(frozen=True)
class PushReply:
    """What became of a push part, with its shards' new values when it asked for them.
    `incarnation` names the ps process whose values they are, as in PullReply: a worker that
    missed a ps restart learns from it that its next gradients are computed on the new
    process's values (their `basis`)."""

    step: int
    outcome: PushOutcome
    incarnation: str = field(default="", compare=False)
    moved: tuple[str, ...] = ()  # MOVED: the part's shards this ps released (the part was not applied)

    def fields(self) -> dict[str, Any]:
        fields = _with_incarnation({"step": self.step, "outcome": self.outcome.value}, self.incarnation)
        if self.moved:
            fields["moved"] = list(self.moved)
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "PushReply":
        where = "push reply"
        reply = cls(_int(fields, where, "step"), _enum(PushOutcome, fields, where, "outcome"),
                    _incarnation(fields, where), _names(fields, where, "moved"))
        if (reply.outcome is PushOutcome.MOVED) != bool(reply.moved):
            raise _fail(where, "moved", "the released shards exactly when the outcome is 'moved'", list(reply.moved))
        return reply


def _with_incarnation(fields: dict[str, Any], incarnation: str) -> dict[str, Any]:
    if incarnation:
        fields["incarnation"] = incarnation
    return fields


def _incarnation(fields: Mapping[str, Any], where: str) -> str:
    return _optional_str(fields, where, "incarnation", 64)


@dataclass(frozen=True)
class DoneRequest:
    op = Op.DONE
    task: str

    def fields(self) -> dict[str, Any]:
        return {"task": self.task}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "DoneRequest":
        return cls(_task(fields, "done request"))


@dataclass(frozen=True)
class DoneReply:
    """How many replicas said done so far."""

    done: int

    def fields(self) -> dict[str, Any]:
        return {"done": self.done}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "DoneReply":
        return cls(_int(fields, "done reply", "done"))


@dataclass(frozen=True)
class FailedRequest:
    """A replica left training by an error. It is not done: it may be restarted and carry on.
    Only if every replica failed and none finished does the job end without them.
    `incarnation` is the sending process's (its heartbeats', so a heartbeat of the failed
    process still on its way does not count it again); "" if unknown. `terminated`: it was
    stopped by SIGTERM at a step boundary rather than by an error (logged as such). `started`
    False: its session's start failed before it trained; it leaves the membership (no sync step
    waits for it) but does not count as a failed replica (the job does not end because of it)."""

    op = Op.FAILED
    task: str
    incarnation: str = ""
    terminated: bool = False  # stopped by SIGTERM (shoal kill, shoal scale, preemption), not an error
    started: bool = True  # False: its start failed; it never trained (it leaves, but is not a failed replica)

    def fields(self) -> dict[str, Any]:
        return {"task": self.task, "incarnation": self.incarnation, "terminated": self.terminated,
                "started": self.started}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "FailedRequest":
        where = "failed request"
        incarnation = _str(fields, where, "incarnation", 64, allow_empty=True) if "incarnation" in fields else ""
        return cls(_task(fields, where), incarnation, _bool(fields, where, "terminated", False),
                   _bool(fields, where, "started", True))


MAX_HEARTBEAT_TIMEOUT_MS = 3_600_000
"""The longest a heartbeat may ask the ps to wait for the next one (membership.MAX_TIMEOUT_S,
in ms): a longer one is refused (a member that is gone would otherwise hold the ps's leases and
sync steps that long)."""


MAX_CHALLENGE = 64
"""The longest heartbeat `challenge` (and `answer`)."""


@dataclass(frozen=True)
class HeartbeatRequest:
    """`task` (process `incarnation`) is alive and training; count it as gone if no heartbeat
    comes within `timeout_ms`. Its first heartbeat makes it a member (shoal/ps/membership.py).
    `answer`: the last `challenge` this ps's reply gave it ("" if none; optional on the wire)."""

    op = Op.HEARTBEAT
    task: str
    incarnation: str
    timeout_ms: int
    answer: str = ""

    def fields(self) -> dict[str, Any]:
        fields = {"task": self.task, "incarnation": self.incarnation, "timeout_ms": self.timeout_ms}
        if self.answer:
            fields["answer"] = self.answer
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "HeartbeatRequest":
        where = "heartbeat request"
        return cls(_task(fields, where), _str(fields, where, "incarnation", 64),
                   _int(fields, where, "timeout_ms", minimum=1, maximum=MAX_HEARTBEAT_TIMEOUT_MS),
                   _optional_str(fields, where, "answer", MAX_CHALLENGE))


@dataclass(frozen=True)
class HeartbeatReply:
    """The ps's membership `version` after this heartbeat; `joined`: it made the sender a
    member (its first, or it had been dropped); `members`: how many train now; `challenge`:
    the sender was dropped for its silence, and its next heartbeat must carry this as its
    `answer` to be a member again ("" otherwise; optional on the wire)."""

    version: int
    joined: bool
    members: int
    challenge: str = ""

    def fields(self) -> dict[str, Any]:
        fields = {"version": self.version, "joined": self.joined, "members": self.members}
        if self.challenge:
            fields["challenge"] = self.challenge
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "HeartbeatReply":
        where = "heartbeat reply"
        return cls(_int(fields, where, "version"), _bool(fields, where, "joined"), _int(fields, where, "members"),
                   _optional_str(fields, where, "challenge", MAX_CHALLENGE))


@dataclass(frozen=True)
class ShutdownRequest:
    op = Op.SHUTDOWN
    task: str

    def fields(self) -> dict[str, Any]:
        return {"task": self.task}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ShutdownRequest":
        return cls(_task(fields, "shutdown request"))


@dataclass(frozen=True)
class LeaseRequest:
    """Ask ps 0 for up to `count` positions of the training set. `num_examples` and `seed`
    declare the data set (the first request fixes them for the job; a request with others is
    refused naming both). `holder` is random per worker process: a request from a new `holder`
    of the same task gives that task's earlier leases back first (a restarted worker). No
    position of an epoch >= `until_epoch` is handed out (None: no end)."""

    op = Op.LEASE
    task: str
    holder: str
    num_examples: int
    seed: int
    count: int
    until_epoch: int | None = None

    def fields(self) -> dict[str, Any]:
        return {"task": self.task, "holder": self.holder, "num_examples": self.num_examples, "seed": self.seed,
                "count": self.count, "until_epoch": self.until_epoch}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "LeaseRequest":
        where = "lease request"
        until = fields.get("until_epoch")
        return cls(_task(fields, where), _str(fields, where, "holder", 64),
                   _int(fields, where, "num_examples", 1, maximum=MAX_EXAMPLES),
                   _int(fields, where, "seed", 0, maximum=_MAX_ID), _int(fields, where, "count", 1, maximum=_MAX_ID),
                   None if until is None else _int(fields, where, "until_epoch", 1, maximum=_MAX_ID))


@dataclass(frozen=True)
class LeaseReply:
    """GRANTED: positions [start, end) of `epoch`, as lease `lease` of book `book`. WAIT: none
    free now; `held_by` names the tasks holding the rest. EXHAUSTED: none left before the
    request's `until_epoch`. `released`: positions of this task's earlier leases given back."""

    state: LeaseState
    book: str
    lease: int = 0
    epoch: int = 0
    start: int = 0
    end: int = 0
    held_by: tuple[str, ...] = ()
    released: int = 0

    def fields(self) -> dict[str, Any]:
        return {"state": self.state.value, "book": self.book, "lease": self.lease, "epoch": self.epoch,
                "start": self.start, "end": self.end, "held_by": list(self.held_by), "released": self.released}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "LeaseReply":
        where = "lease reply"
        reply = cls(_enum(LeaseState, fields, where, "state"), _str(fields, where, "book", 64),
                    _int(fields, where, "lease", maximum=_MAX_ID), _int(fields, where, "epoch", maximum=_MAX_ID),
                    _int(fields, where, "start", maximum=MAX_EXAMPLES), _int(fields, where, "end", maximum=MAX_EXAMPLES),
                    _names(fields, where, "held_by", MAX_TASK_NAME), _int(fields, where, "released", maximum=_MAX_ID))
        if reply.state is LeaseState.GRANTED and not reply.start < reply.end:
            raise _fail(where, "end", f"greater than start ({reply.start}) in a granted lease", reply.end)
        return reply


@dataclass(frozen=True)
class ReplicateRequest:
    """ps `source` (process `incarnation`) sends its successor a whole copy of its shards:
    values and "<shard>@<slot>" state, all of `step`, with its update rule, training mode and
    (ps 0) lease book state. The successor holds it in place of the one before (replicas.py)."""

    op = Op.REPLICATE
    source: int
    incarnation: str
    step: int
    training: TrainingMode
    rule: dict
    leases: dict | None = None

    def fields(self) -> dict[str, Any]:
        fields = {"source": self.source, "incarnation": self.incarnation, "step": self.step,
                  **_mode_fields(self.training), "rule": self.rule}
        if self.leases is not None:
            fields["leases"] = self.leases
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReplicateRequest":
        where = "replicate request"
        return cls(_int(fields, where, "source", maximum=_MAX_ID), _str(fields, where, "incarnation", 64),
                   _int(fields, where, "step", maximum=_MAX_ID), _training_mode(fields, where),
                   _map(fields, where, "rule"), _optional_map(fields, where, "leases"))


@dataclass(frozen=True)
class ReplicateReply:
    """The step of the replica of `source` the successor holds now (the one just sent, or a
    newer one of the same process that overtook it)."""

    held_step: int

    def fields(self) -> dict[str, Any]:
        return {"held_step": self.held_step}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReplicateReply":
        return cls(_int(fields, "replicate reply", "held_step"))


@dataclass(frozen=True)
class ReplicaRequest:
    """The copy of ps `source`'s shards this ps holds, if any (the chief asks ps (source+1) % n
    when ps `source` restarted)."""

    op = Op.REPLICA
    source: int

    def fields(self) -> dict[str, Any]:
        return {"source": self.source}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReplicaRequest":
        return cls(_int(fields, "replica request", "source", maximum=_MAX_ID))


@dataclass(frozen=True)
class ReplicaReply:
    """`present`: whether a replica of `source` is held; if so it travels with this reply
    (values and "<shard>@<slot>" state) and the other fields describe it as its
    ReplicateRequest did; `age_ms` is how long ago it arrived."""

    present: bool
    source: int
    incarnation: str = ""
    step: int = 0
    training: TrainingMode | None = None
    rule: dict | None = None
    leases: dict | None = None
    age_ms: int = 0

    def fields(self) -> dict[str, Any]:
        if not self.present:
            return {"present": False, "source": self.source}
        fields = {"present": True, "source": self.source, "incarnation": self.incarnation, "step": self.step,
                  **_mode_fields(self.training), "rule": self.rule, "age_ms": self.age_ms}
        if self.leases is not None:
            fields["leases"] = self.leases
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReplicaReply":
        where = "replica reply"
        source = _int(fields, where, "source", maximum=_MAX_ID)
        if not _bool(fields, where, "present"):
            return cls(False, source)
        return cls(True, source, _str(fields, where, "incarnation", 64), _int(fields, where, "step", maximum=_MAX_ID),
                   _training_mode(fields, where), _map(fields, where, "rule"), _optional_map(fields, where, "leases"),
                   _int(fields, where, "age_ms", maximum=_MAX_ID))


@dataclass(frozen=True)
class AdoptRequest:
    """Re-homing (shoal/ps/adoption.py): ps `source` did not come back, and this ps takes over
    the shards of it that travel with this request (values and "<shard>@<slot>" state, all of
    `step`: the step of the replica or checkpoint they come from; possibly none). `retired` are
    all the ps tasks re-homed so far, in the order they were, `source` last: the placement every
    worker must use from now on (shoal/train/rehome_placement.py, docs/checkpoints.md)."""

    op = Op.ADOPT
    source: int
    step: int
    retired: tuple[int, ...]
    moving: bool = False  # the shards were released by a live `source` for a ps that joined: nothing retires

    def fields(self) -> dict[str, Any]:
        fields = {"source": self.source, "step": self.step, "retired": list(self.retired)}
        if self.moving:
            fields["moving"] = True
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "AdoptRequest":
        where = "adopt request"
        source = _int(fields, where, "source", maximum=MAX_PS - 1)
        retired = _indices(fields, where, "retired")
        moving = _bool(fields, where, "moving", False)
        if not moving and (not retired or retired[-1] != source):
            raise _fail(where, "retired", f"a list of ps indices that ends with the source, {source}", list(retired))
        return cls(source, _int(fields, where, "step", maximum=_MAX_ID), retired, moving)


@dataclass(frozen=True)
class AdoptReply:
    """How many of the shards were new to this ps (a repeated `adopt` creates none), and this
    ps's step once it holds them."""

    created: int
    step: int

    def fields(self) -> dict[str, Any]:
        return {"created": self.created, "step": self.step}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "AdoptReply":
        return cls(_int(fields, "adopt reply", "created"), _int(fields, "adopt reply", "step"))


MAX_JOINED = 256
"""The most ps tasks ps 0 registers (`join`): a bound on the memory a registry may take."""
MAX_ADDRESS = 255
_ADDRESS = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")


def _address(fields: Mapping[str, Any], where: str, key: str) -> str:
    value = fields.get(key)
    match = _ADDRESS.fullmatch(value) if isinstance(value, str) and 0 < len(value) <= MAX_ADDRESS else None
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise _fail(where, key, f"host:port (up to {MAX_ADDRESS} characters, port 1..65535)", value)
    return value


@dataclass(frozen=True)
class JoinedPs:
    """A ps task that registered with ps 0 (`join`): its cluster index and address."""

    index: int
    address: str

    def fields(self) -> list:
        return [self.index, self.address]

    @classmethod
    def decode_list(cls, fields: Mapping[str, Any], where: str, key: str) -> "tuple[JoinedPs, ...]":
        value = fields.get(key, [])
        want = f"a list of up to {MAX_JOINED} [ps index, host:port]"
        if not isinstance(value, list) or len(value) > MAX_JOINED:
            raise _fail(where, key, want, value)
        out = []
        for item in value:
            if not (isinstance(item, list) and len(item) == 2):
                raise _fail(where, key, want, item)
            out.append(cls(_int({"index": item[0]}, where, "index", maximum=MAX_PS - 1),
                           _address({"address": item[1]}, where, "address")))
        return tuple(out)


class ChangeKind(str, Enum):
    """One change of the job's placement: a ps re-homed (its shards went to the others) or a ps
    joined (shards moved onto it)."""

    RETIRE = "retire"
    JOIN = "join"


MAX_HISTORY = 2 * MAX_JOINED
"""The most placement changes a history holds."""


@dataclass(frozen=True)
class PlacementChange:
    """ps `ps` (its cluster index) retired or joined (at `address`, for a join). Replayed in
    order from the initial placement, a history gives every task the same placement
    (shoal/train/placement_history.py). On the wire: [kind, ps, address]."""

    kind: ChangeKind
    ps: int
    address: str = ""

    def fields(self) -> list:
        return [self.kind.value, self.ps, self.address]

    @classmethod
    def decode_list(cls, fields: Mapping[str, Any], where: str, key: str) -> "tuple[PlacementChange, ...]":
        value = fields.get(key, [])
        want = f"a list of up to {MAX_HISTORY} [retire|join, ps index, host:port of a join or '']"
        if not isinstance(value, list) or len(value) > MAX_HISTORY:
            raise _fail(where, key, want, value)
        out = []
        for item in value:
            if not (isinstance(item, list) and len(item) == 3):
                raise _fail(where, key, want, item)
            kind = _enum(ChangeKind, {"kind": item[0]}, where, "kind")
            ps = _int({"ps": item[1]}, where, "ps", maximum=MAX_PS - 1)
            if kind is ChangeKind.JOIN:
                address = _address({"address": item[2]}, where, "address")
            elif item[2] != "":
                raise _fail(where, key, "'' as the address of a retire", item)
            else:
                address = ""
            out.append(cls(kind, ps, address))
        return tuple(out)


@dataclass(frozen=True)
class JoinRequest:
    """ps `index` serves at `address` (a ps task tells ps 0, once it serves; a ps added to a
    running job is found this way: the chief reads the registry in ps 0's `status`)."""

    op = Op.JOIN
    index: int
    address: str

    def fields(self) -> dict[str, Any]:
        return {"index": self.index, "address": self.address}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "JoinRequest":
        where = "join request"
        return cls(_int(fields, where, "index", 1, maximum=MAX_PS - 1), _address(fields, where, "address"))


@dataclass(frozen=True)
class JoinReply:
    """`registered`: how many ps tasks ps 0 knows now; `num_ps`: how many its own cluster lists
    (a ps of a higher index was added to the running job, and is not in the replica ring);
    `retired`: the joining ps was re-homed (its shards moved to the others) before this process
    started, so the job trains without it."""

    registered: int
    num_ps: int
    retired: bool = False

    def fields(self) -> dict[str, Any]:
        return {"registered": self.registered, "num_ps": self.num_ps, "retired": self.retired}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "JoinReply":
        where = "join reply"
        return cls(_int(fields, where, "registered"), _int(fields, where, "num_ps", 1),
                   _bool(fields, where, "retired", False))


@dataclass(frozen=True)
class ReleaseRequest:
    """Stop serving shards `names` (they move to ps `target`, which joined): from now on a push or
    pull naming one is answered MOVED, and a sync push waiting for its step that includes one is
    answered MOVED at once. The reply carries their values and "<shard>@<slot>" state."""

    op = Op.RELEASE
    names: tuple[str, ...]
    target: int

    def fields(self) -> dict[str, Any]:
        return {"names": list(self.names), "target": self.target}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReleaseRequest":
        where = "release request"
        names = _names(fields, where, "names", required=True)
        if not names or len(set(names)) != len(names):
            raise _fail(where, "names", "a non-empty list of distinct shard names", list(names))
        return cls(names, _int(fields, where, "target", 1, maximum=MAX_PS - 1))


class ReleaseState(str, Enum):
    """What a `release` did: handed the shards over (RELEASED); or nothing, because in sync mode
    the step is applied to some of the named shards but not all, or some still catch up a step
    after re-homing (BUSY: ask again in a moment)."""

    RELEASED = "released"
    BUSY = "busy"


MAX_REASON = 512
"""The longest `reason` a BUSY release reply may carry."""


@dataclass(frozen=True)
class ReleaseReply:
    """RELEASED: the shards' values (with the reply) are of `step` (sync: their step; a repeated
    release of the same shards answers them again). BUSY: nothing was released; `reason` says why
    to a person (the chief decides on `state`, never on the text), `step` is the ps's. A reply
    without `state` (a ps that predates it, whose every release reply released) is RELEASED."""

    step: int
    state: ReleaseState = ReleaseState.RELEASED
    reason: str = ""

    def fields(self) -> dict[str, Any]:
        fields = {"step": self.step, "state": self.state.value}
        if self.reason:  # cut to what decode accepts: long shard names must not turn BUSY into an error
            fields["reason"] = self.reason if len(self.reason) <= MAX_REASON else self.reason[:MAX_REASON - 3] + "..."
        return fields

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "ReleaseReply":
        where = "release reply"
        state = _enum(ReleaseState, {"state": fields.get("state", ReleaseState.RELEASED.value)}, where, "state")
        if state is ReleaseState.BUSY:
            reason = _str(fields, where, "reason", MAX_REASON)
        elif "reason" in fields:
            raise _fail(where, "reason", "absent in a released reply (only a busy one says why)", fields["reason"])
        else:
            reason = ""
        return cls(_int(fields, where, "step"), state, reason)


@dataclass(frozen=True)
class PlaceRequest:
    """The job's placement history (every change so far, in order); the ps reports it in `status`
    (it never shrinks: an older or diverging history is refused)."""

    op = Op.PLACE
    history: tuple[PlacementChange, ...]

    def fields(self) -> dict[str, Any]:
        return {"history": [c.fields() for c in self.history]}

    @classmethod
    def decode(cls, fields: Mapping[str, Any]) -> "PlaceRequest":
        return cls(PlacementChange.decode_list(fields, "place request", "history"))


REQUEST_TYPES: dict[Op, type] = {
    Op.STATUS: StatusRequest, Op.INIT: InitRequest, Op.SNAPSHOT: SnapshotRequest, Op.READY: ReadyRequest,
    Op.PULL: PullRequest, Op.PUSH: PushRequest, Op.DONE: DoneRequest, Op.FAILED: FailedRequest,
    Op.SHUTDOWN: ShutdownRequest, Op.HEARTBEAT: HeartbeatRequest, Op.LEASE: LeaseRequest,
    Op.REPLICATE: ReplicateRequest, Op.REPLICA: ReplicaRequest, Op.ADOPT: AdoptRequest, Op.JOIN: JoinRequest,
    Op.RELEASE: ReleaseRequest, Op.PLACE: PlaceRequest,
}
REPLY_TYPES: dict[Op, type] = {
    Op.STATUS: StatusReply, Op.INIT: InitReply, Op.SNAPSHOT: SnapshotReply, Op.READY: Empty,
    Op.PULL: PullReply, Op.PUSH: PushReply, Op.DONE: DoneReply, Op.FAILED: Empty, Op.SHUTDOWN: Empty,
    Op.HEARTBEAT: HeartbeatReply,
    Op.LEASE: LeaseReply, Op.REPLICATE: ReplicateReply, Op.REPLICA: ReplicaReply, Op.ADOPT: AdoptReply,
    Op.JOIN: JoinReply, Op.RELEASE: ReleaseReply, Op.PLACE: Empty,
}


def parse_op(value: Any) -> Op:
    """The Op named `value`; PsError naming the ops this ps speaks if there is none."""
    op = _members(Op).get(value) if isinstance(value, str) else None  # (a dict lookup: calling the Enum costs more)
    if op is None:
        raise PsError(f"unknown op {value!r:.50}; this ps speaks {', '.join(op.value for op in Op)} "
                      "(is the peer a Shoal task of the same version?)")
    return op


def split_slots(tensors: Mapping[str, Any]) -> tuple[dict, dict]:
    """Tensors named "<shard>@<slot>" are optimizer state (shard -> slot -> value); the rest
    are shard values."""
    values: dict = {}
    slots: dict = {}
    for name, value in tensors.items():
        shard, sep, slot = name.rpartition(SLOT_SEPARATOR)
        if sep:
            slots.setdefault(shard, {})[slot] = value
        else:
            values[name] = value
    return values, slots


def slot_key(shard: str, slot: str) -> str:
    """The tensor name of one shard's optimizer slot."""
    return f"{shard}{SLOT_SEPARATOR}{slot}"
