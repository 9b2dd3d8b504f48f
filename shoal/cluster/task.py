"""Job names and task identities: `JOBS`, `normalize_job` and `TaskId`.

Pure data, no I/O; everything here is immutable and thread-safe.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from shoal.cluster.errors import ClusterError

JOBS = ("chief", "worker", "ps", "evaluator")
"""The job names Shoal knows, in the order jobs are listed everywhere."""

JOB_ALIASES = {"master": "chief"}
"""TF1 names accepted on input and normalized to the current name."""

_TASK_RE = re.compile(r"([A-Za-z_]+):([0-9]+)")


def normalize_job(name: object, label: str) -> str:
    """Return the canonical job name for `name` ('master' becomes 'chief').

    `label` says where the name came from (e.g. "TF_CONFIG task.type", "--job_name") and
    starts the error message. Raises ClusterError when `name` is not a job name.
    """
    if isinstance(name, str):
        name = JOB_ALIASES.get(name, name)
        if name in JOBS:
            return name
    hint = ""
    if isinstance(name, str):
        close = difflib.get_close_matches(name, JOBS + tuple(JOB_ALIASES), n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    raise ClusterError(
        f"{label} {name!r} is not a job{hint}; use one of {', '.join(JOBS)}"
        " ('master' is accepted as 'chief')"
    )


def check_index(index: object, label: str) -> int:
    """Return `index` as an int if it is a non-negative int or a string of digits.

    Booleans are refused (JSON `true` is not an index). Raises ClusterError naming `label`.
    """
    if isinstance(index, str) and re.fullmatch(r"[0-9]+", index.strip()):
        return int(index.strip())
    if isinstance(index, int) and not isinstance(index, bool):
        if index >= 0:
            return index
        raise ClusterError(f"{label} {index} is negative; task indices start at 0")
    raise ClusterError(
        f"{label} {index!r} is not a task index; use a non-negative integer such as 0"
    )


@dataclass(frozen=True)
class TaskId:
    """One task of a cluster: a job name and an index, printed as "worker:1".

    `job` is normalized on construction ('master' becomes 'chief'); an unknown job or a
    negative index raises ClusterError. Immutable, hashable and ordered by (job, index)
    only through `ClusterSpec.tasks()`, which lists tasks in JOBS order.
    """

    job: str
    index: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "job", normalize_job(self.job, "task job"))
        object.__setattr__(self, "index", check_index(self.index, f"task {self.job} index"))

    def __str__(self) -> str:
        return f"{self.job}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> "TaskId":
        """Parse "job:index" (e.g. "worker:1", "master:0") into a TaskId."""
        match = _TASK_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ClusterError(
                f"task {text!r} is not of the form job:index; write it as e.g. 'worker:1'"
            )
        return cls(match.group(1), int(match.group(2)))
