"""Task and job states, with their legal transitions written down.

Task:  PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | KILLED
       RUNNING -> RESTARTING -> STARTING   (restart policy, same identity)
       STARTING -> FAILED (could not exec);  PENDING | RESTARTING -> KILLED (job stopped)
       STARTING -> RESTARTING   (its lost host still does not answer: tried again later)
       STARTING -> SCALED_DOWN   (scaled down while its lost host was being reconnected)
       RESTARTING -> FAILED   (not started again: the job's training ended meanwhile)
       PENDING | RUNNING | RESTARTING -> SCALED_DOWN   (`shoal scale` stopped it; an expected end)
       RUNNING -> MOVED   (its host was lost; a replacement runs on another host: relocation.py)
Job:   PENDING -> RUNNING -> SUCCEEDED | FAILED | KILLED;  PENDING -> FAILED | KILLED
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class TaskState(str, Enum):
    """Where one task is in its life; `is_terminal` states never change again."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    SCALED_DOWN = "SCALED_DOWN"
    MOVED = "MOVED"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED,
                        TaskState.SCALED_DOWN, TaskState.MOVED)

    @property
    def is_retired(self) -> bool:
        """Ended on purpose and no longer part of the job: scaled down, or moved to another
        host (its replacement is the task that counts)."""
        return self in (TaskState.SCALED_DOWN, TaskState.MOVED)


class JobState(str, Enum):
    """Where a whole job is; `is_terminal` states never change again."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.STARTING, TaskState.KILLED, TaskState.SCALED_DOWN}),
    TaskState.STARTING: frozenset({TaskState.RUNNING, TaskState.FAILED, TaskState.KILLED, TaskState.RESTARTING,
                                   TaskState.SCALED_DOWN}),
    TaskState.RUNNING: frozenset(
        {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED, TaskState.RESTARTING,
         TaskState.SCALED_DOWN, TaskState.MOVED}
    ),
    TaskState.RESTARTING: frozenset({TaskState.STARTING, TaskState.KILLED, TaskState.SCALED_DOWN, TaskState.FAILED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.KILLED: frozenset(),
    TaskState.SCALED_DOWN: frozenset(),
    TaskState.MOVED: frozenset(),
}

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.FAILED, JobState.KILLED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.KILLED: frozenset(),
}


def running_of(states: Iterable[TaskState]) -> str:
    """"R/N running": R tasks running of the N still in the job. A task replaced (MOVED to
    another host) or removed (SCALED_DOWN) on purpose is not counted in N; its replacement is."""
    states = list(states)
    running = sum(s is TaskState.RUNNING for s in states)
    current = sum(not s.is_retired for s in states)
    return f"{running}/{current} running"
