"""What a user may write for a job or one of its tasks on the command line, resolved
against the job records.

A job is its number (`12`, the `#` column of `shoal status`), its id, its name (the
newest job of that name) or a unique prefix of its id (`JobStore.find` says the order);
no job at all means the newest one. A task is `JOB.ROLE.INDEX` (`12.worker.1`,
`mnist.ps.0`), as a job's tasks are labelled in its output. Blocks on SQLite's locks;
as thread-safe as the JobStore passed in.
"""

from __future__ import annotations

import difflib
import re
from typing import Optional

from shoal.cluster import JOBS
from shoal.launch.errors import JobNotFound
from shoal.launch.records import JobRecord, JobStore

TASK_REF_RE = re.compile(rf"(?P<job>.+)\.(?P<task>(?:{'|'.join(JOBS)})\.\d+)")
_TASK_SHAPE_RE = re.compile(r"(?P<job>.+)\.(?P<role>[A-Za-z_]+)\.(?P<index>\d+)")  # a role misspelt, say


def find_job(store: JobStore, ref: Optional[str]) -> JobRecord:
    """The job `ref` names, the newest job if `ref` is None or empty; JobNotFound otherwise."""
    return store.find(ref) if ref else store.newest()


def find_running_job(store: JobStore, ref: Optional[str]) -> JobRecord:
    """The job `ref` names; without `ref`, the newest job still recorded as running (so a job
    that ended since does not shadow the one to stop, follow, watch or scale), else the newest
    job. JobNotFound if there is none."""
    if ref:
        return store.find(ref)
    running = next((job for job in store.list_jobs() if not job.state.is_terminal), None)
    return running or store.newest()


def find_task(store: JobStore, ref: Optional[str]) -> tuple[JobRecord, Optional[str]]:
    """The job `ref` names and the task it names in it ("worker.1"), or None when `ref`
    names only a job. A job whose name or id looks like a task reference wins.
    JobNotFound if there is no such job, or no such task in it."""
    try:
        return find_job(store, ref), None
    except JobNotFound:
        match = TASK_REF_RE.fullmatch(ref or "")
        if match is None:
            _refuse_a_misspelt_role(store, ref or "")
            raise
    job = store.find(match.group("job"))
    return job, job.task(match.group("task")).name


def _refuse_a_misspelt_role(store: JobStore, ref: str) -> None:
    """JobNotFound that names the role, when `ref` is JOB.ROLE.INDEX of a job there is with a
    ROLE that is none ("1.wrker.1"); returns for anything else."""
    shape = _TASK_SHAPE_RE.fullmatch(ref)
    if shape is None:
        return
    try:
        store.find(shape.group("job"))
    except JobNotFound:
        return
    role, index = shape.group("role"), shape.group("index")
    close = difflib.get_close_matches(role, JOBS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise JobNotFound(f"{ref!r}: {role!r} is not a role{hint}; a task is JOB.ROLE.INDEX, e.g. "
                      f"{shape.group('job')}.{close[0] if close else 'worker'}.{index}; roles are {', '.join(JOBS)}")
