"""What `shoal scale JOB worker=N` (or `ps=N`) asks of a running job, and the rules for it.

`ScaleRequest` is the ask (a role and the count wanted), `ScaleOutcome` the answer the
launcher gives back ("worker=4 (was 2): started worker:2, worker:3"). The rules, pure so
that they are tested without processes:

* only roles whose spec count is a range MIN..MAX scale (workers and ps:
  shoal/launch/spec.py), and only within it;
* scaling up starts new tasks with fresh indices — one above the highest index that ever
  ran, so a log, a record or a checkpoint of an old task is never taken for a new one;
* scaling down stops the tasks with the highest indices first (TERM, grace, KILL), never
  the job's primary (chief:0, else worker:0); their end is expected: SCALED_DOWN, not a
  failure, not restarted. Only workers scale down: a ps scales up only (`ps_down_refusal`
  says why).

Pure data and functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from shoal.cluster import TaskId
from shoal.launch.errors import ScaleError
from shoal.launch.spec import SCALABLE_ROLES


@dataclass(frozen=True)
class ScaleRequest:
    """Set `role`'s live task count to `count`."""

    role: str
    count: int

    def describe(self) -> str:
        return f"{self.role}={self.count}"


@dataclass(frozen=True)
class ScaleOutcome:
    """The launcher's answer: `error` (why nothing changed), or the count before (`was`) and
    the tasks started and those being stopped (task names as "worker:2")."""

    role: str
    count: int
    was: Optional[int] = None
    started: tuple[str, ...] = ()
    stopping: tuple[str, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def describe(self) -> str:
        """"worker=4 (was 2): started worker:2, worker:3", or the error."""
        if self.error:
            return self.error
        head = f"{self.role}={self.count} (was {self.was})"
        if self.started:
            return f"{head}: started {', '.join(self.started)}"
        if self.stopping:
            return f"{head}: stopping {', '.join(self.stopping)}"
        return f"{head}: nothing to change"

    def as_json(self) -> dict[str, Any]:
        return {"role": self.role, "count": self.count, "was": self.was,
                "started": list(self.started), "stopping": list(self.stopping), "error": self.error}

    @classmethod
    def from_json(cls, data: Any) -> "ScaleOutcome":
        """Parse `as_json`'s output; ValueError if it is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"a scale answer must be a JSON object, not {data!r:.80}")
        try:
            was = data.get("was")
            return cls(role=str(data["role"]), count=int(data["count"]),
                       was=None if was is None else int(was),
                       started=tuple(str(t) for t in data.get("started") or ()),
                       stopping=tuple(str(t) for t in data.get("stopping") or ()),
                       error=str(data.get("error") or ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a damaged scale answer: {data!r:.120}") from e


SHRINKING_ROLES = ("worker",)
"""The roles `shoal scale` may also scale down; the other SCALABLE_ROLES (ps) only grow."""


def check_request(request: ScaleRequest, scale_range: Optional[tuple[int, int]], live_count: int,
                  executor_kind: str, can_add: bool) -> None:
    """ScaleError unless `request` may be applied to a job whose `request.role` count has
    range `scale_range` (None: fixed) and is `live_count` now, run by an executor of
    `executor_kind` that can (`can_add`) or cannot add tasks."""
    role, count = request.role, request.count
    if role not in SCALABLE_ROLES:
        why = "a cluster has one chief" if role == "chief" else f"{role} tasks do not scale"
        raise ScaleError(f"{role}={count}: only workers scale, and ps up only ({why}); write"
                         " worker=N or ps=N")
    if role not in SHRINKING_ROLES and count < live_count:
        raise ScaleError(ps_down_refusal(count, live_count))
    if scale_range is None:
        flag = "--ps" if role == "ps" else f"--{role}s"
        raise ScaleError(
            f"{role}={count}: this job's {role} count is fixed at {live_count}; to scale it, start"
            f" the job with roles.{role}.count: MIN..MAX in its spec (or shoal run {flag} MIN..MAX)")
    low, high = scale_range
    if not low <= count <= high:
        raise ScaleError(
            f"{role}={count} is outside this job's range {low}..{high} (roles.{role}.count); pick"
            f" a count from {low} to {high}, or start the job again with a wider range (a chief"
            " with a checkpoint resumes where it stopped)")
    if not can_add:
        name = "Slurm" if executor_kind == "slurm" else executor_kind
        raise ScaleError(f"shoal scale is not supported for {name} jobs yet (it is for local and"
                         " ssh jobs)")


def ps_down_refusal(count: int, live_count: int) -> str:
    """Why `ps=count` is refused for a job that has `live_count` ps, and what to do instead."""
    return (f"ps={count} (was {live_count}): a ps scales up only; only workers scale down. shoal scale never"
            " stops a single ps: a ps holds shards of the variables (one that exits is restarted or ends the"
            " job; one out of reach past --ps_recovery_timeout has its shards moved to the others: re-homing,"
            " docs/checkpoints.md; shoal kill stops the whole job). To train on fewer ps, start the job again"
            " with a lower roles.ps.count (shoal run --ps N): its checkpoint restores into any number of ps")


def new_indices(used: Iterable[int], how_many: int) -> list[int]:
    """`how_many` fresh task indices, each above every index in `used` (those that ever ran)."""
    first = max(used, default=-1) + 1
    return list(range(first, first + how_many))


def to_stop(live: Sequence[TaskId], how_many: int, primary: TaskId) -> list[TaskId]:
    """The `how_many` tasks of `live` a scale-down stops: the highest indices first, never
    `primary`."""
    candidates = sorted((t for t in live if t != primary), key=lambda t: t.index, reverse=True)
    return candidates[:how_many]


def task_word(task: TaskId) -> str:
    """"worker:2", as outcomes and ps membership lines name tasks."""
    return f"{task.job}:{task.index}"


__all__ = ["SHRINKING_ROLES", "ScaleOutcome", "ScaleRequest", "check_request", "new_indices", "ps_down_refusal",
           "task_word", "to_stop"]
