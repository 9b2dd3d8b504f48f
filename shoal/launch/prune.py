"""Pruning finished jobs: which to remove (`prunable`, pure) and removing one
(`remove_job`: its folder under $SHOAL_HOME/jobs, then its records).

Only a job that is over (a terminal state, its launcher gone) is ever removed. The folder
removed is the job's own, `$SHOAL_HOME/jobs/<id>` — its logs, and its model dir when that
lies inside (the default); a recorded folder anywhere else is left alone, and so is an
`output_dir` outside it. Blocking (file removal, SQLite); not thread-safe for one job.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from shoal.launch.errors import WorkspaceError
from shoal.launch.records import JobRecord, JobStore


@dataclass(frozen=True)
class Pruned:
    """What removing one job did (or, in a dry run, would do)."""

    job: JobRecord
    removed_dir: Optional[str]
    """The job's folder, removed; None if it was not where job folders are."""
    left: tuple[str, ...]
    """Folders of the job left in place (a model dir outside the job's folder)."""


def prunable(jobs: Sequence[JobRecord], *, keep: int, older_than: Optional[float], now: float,
             running: Callable[[JobRecord], bool]) -> list[JobRecord]:
    """The jobs to remove, newest first: those over (terminal and not `running`: its
    launcher still runs), but the `keep` newest of them, and if `older_than` (seconds) is
    given only those that ended at least that long before `now`. `jobs` are newest first."""
    over = [job for job in jobs if job.state.is_terminal and not running(job)]
    chosen = over[max(0, keep):]
    if older_than is not None:
        chosen = [job for job in chosen if (job.ended or job.created) <= now - older_than]
    return chosen


def remove_job(store: JobStore, job: JobRecord, jobs_root: Path, *, dry_run: bool = False,
               in_use: Sequence[str] = ()) -> Pruned:
    """Remove the job's folder (if it is `jobs_root/<id>` and holds none of `in_use`, the model
    dirs of jobs still running) and then its records; with `dry_run`, only say what would go.
    WorkspaceError if the folder cannot be removed (the records are kept then, so pruning again
    retries)."""
    folder = Path(job.job_dir)
    own = folder.parent.resolve() == jobs_root.resolve() and folder.name == job.id
    if own and any(_inside(Path(used), folder) for used in in_use):
        own = False  # a running job trains in it (its --output-dir points there)
    left = [] if own else [job.job_dir]
    if not _inside(Path(job.model_dir), folder):
        left.append(job.model_dir)
    if not dry_run:
        if own:
            try:
                shutil.rmtree(folder)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise WorkspaceError(
                    f"cannot remove {folder} of job {job.id}: {e.strerror or e}; fix its"
                    " permissions and prune again") from e
        store.delete_job(job.id)
    return Pruned(job, str(folder) if own else None, tuple(left))


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False
