"""Resource samples of a job's tasks for `shoal monitor`: CPU %, memory, and GPU use
where the executor can tell. Each task counts its whole process tree.

`sample_job` blocks for `interval` seconds (CPU % needs two readings); thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from shoal.launch.executor import Executor, TaskRef, Usage
from shoal.launch.records import JobRecord, JobStore
from shoal.launch.states import TaskState


@dataclass(frozen=True)
class TaskSample:
    """One task's state and use of its host; `usage` None when it does not run."""

    name: str
    state: TaskState
    pid: Optional[int]
    usage: Optional[Usage]
    host: str = ""
    """Where its current process runs: an ssh host or a Slurm node; "" for this machine."""


def sample_job(store: JobStore, job: JobRecord, executor: Executor,
               interval: float = 0.5) -> list[TaskSample]:
    """Measure every task of `job` over `interval` seconds, through its executor."""
    latest: dict[str, TaskRef] = {}
    for rec in store.processes(job.id):
        latest[rec.name] = rec.ref  # in start order: the last one is the current attempt
    usage = executor.sample(latest, interval)
    return [TaskSample(t.name, t.state, t.pid, usage.get(t.name), latest[t.name].host if t.name in latest else "")
            for t in job.tasks]
