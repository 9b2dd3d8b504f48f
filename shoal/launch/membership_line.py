"""`MembershipLine`: what the launcher reads from a ps's membership line, and `parse_membership`.

On every change of who trains, each ps logs one line (the contract between the ps and the
launcher, as progress lines are; see progress_line.py)::

    ps:0 membership v3: 2 training [chief:0, worker:0]; worker:1 left (no heartbeat for 20s)

i.e. `<task> membership v<version>: <n> training [<comma-separated tasks>]`, optionally
followed by `; <what changed>`, anywhere in a line (a log prefix before it is fine). The
launcher keeps the latest one of ps:0 in the job records; `shoal status` shows it. Pure and
thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

MEMBERSHIP_RE = re.compile(
    rb"\b(?P<task>(?:chief|worker|ps|evaluator):\d+) membership v(?P<version>\d+):"
    rb" (?P<count>\d+) training \[(?P<tasks>[^\]\r\n]*)\](?:; (?P<change>[^\r\n]*))?")
_TASK_RE = re.compile(r"(?:chief|worker|ps|evaluator):\d+")


@dataclass(frozen=True)
class MembershipLine:
    """One membership line: the ps that logged it ("ps:0"), the membership `version`, how many
    train (`count`, as logged), the tasks training ("chief:0", "worker:0") and what changed
    ("" when the line says nothing)."""

    reporter: str
    version: int
    count: int
    tasks: tuple[str, ...]
    change: str = ""

    @property
    def tasks_text(self) -> str:
        """The tasks as the line lists them: "chief:0, worker:0"."""
        return ", ".join(self.tasks)


def parse_membership(line: bytes) -> Optional[MembershipLine]:
    """The membership in `line`, or None if it is not a membership line (also when a task in
    its list is not of the form job:index)."""
    if b" membership v" not in line:
        return None
    match = MEMBERSHIP_RE.search(line)
    if match is None:
        return None
    listed = match.group("tasks").decode("utf-8", "replace")
    tasks = tuple(word.strip() for word in listed.split(",") if word.strip())
    if not all(_TASK_RE.fullmatch(task) for task in tasks):
        return None
    change = match.group("change")
    return MembershipLine(
        reporter=match.group("task").decode(), version=int(match.group("version")),
        count=int(match.group("count")), tasks=tasks,
        change=change.decode("utf-8", "replace").strip() if change else "",
    )
