"""Errors raised by `shoal.launch`. Only `shoal.cli` turns them into exit codes."""

from __future__ import annotations

from typing import Optional

from shoal.errors import ShoalError


class LaunchError(ShoalError):
    """Base class of the launcher's errors: a job could not be specified, planned or run."""


class SpecError(LaunchError):
    """A job spec (YAML file or flags) is invalid.

    `source` is the file (or "flags"), `line` the 1-based line of the bad field when known,
    `field` the dotted path of the field ("roles.worker.count"). The message starts with
    "FILE:LINE: field: ..." so editors can jump to it.
    """

    def __init__(
        self, message: str, *, source: str = "", line: Optional[int] = None, field: str = ""
    ) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.detail = message
        where = source + (f":{line}" if source and line else "")
        prefix = ": ".join(part for part in (where, field) if part)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class PlanError(LaunchError):
    """A valid spec cannot be planned here (no free port, GPUs asked for but absent, ...)."""


class JobNotFound(LaunchError):
    """No recorded job matches the id or name the user gave."""


class StartError(LaunchError):
    """A task's process could not be started (program not found, not executable, ...)."""


class HostUnreachableError(StartError):
    """A task could not be started again on its host or node, lost during the job, for a reason
    that may pass: the host does not answer yet, the lost agent's leftovers (its processes, its
    Slurm step) are not gone yet, slurmctld does not answer. The supervisor tries again later
    while the task has restarts left."""


class StartDeferred(HostUnreachableError):
    """A task cannot start yet because its lost host is being made usable again in the
    background (host_repairs.py): the supervisor asks again shortly, without counting a
    restart, and serves the job meanwhile."""


class AllocationEndedError(StartError):
    """A task could not be started again because what the job runs in is over (its Slurm job
    was cancelled, ran past its time limit, lost a node): the task fails for good, as it ended,
    and not as a program that could not be started."""


class WorkspaceError(LaunchError):
    """A file or directory the launcher needs cannot be created, read or written
    (SHOAL_HOME, the job records, a job's folder, the model dir)."""


class HostsError(PlanError):
    """Some of the job's hosts cannot run it (unreachable, key refused, no interpreter or
    workdir, another Shoal version, a failed sync), found before any task started. The
    message has one line per bad host."""


class ScaleError(LaunchError):
    """`shoal scale` cannot change the job as asked: it is not running, the count is outside
    its range, the role does not scale, its executor cannot add tasks, or its launcher did
    not answer in time. The message says which and how to fix it."""


class TaskStateUnknown(LaunchError):
    """An executor cannot tell whether a recorded task still runs, or cannot stop it, because
    what it has to ask does not answer (slurmctld hung or unreachable). Unknown is not gone:
    the caller keeps the job as recorded and says so. The message names the command that
    failed and what the user can check by hand."""
