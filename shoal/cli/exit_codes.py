"""`ExitCode`: every exit status `shoal` returns; `exit_code_for` maps errors to them and
`job_exit_code` a finished job's end. The only place either becomes a number."""

from __future__ import annotations

from enum import IntEnum

from shoal.cli.errors import MissingTool, UsageError
from shoal.cluster import ClusterError
from shoal.errors import ShoalError
from shoal.launch.errors import JobNotFound, PlanError, SpecError, StartError, WorkspaceError
from shoal.launch.records import JobRecord
from shoal.launch.states import JobState
from shoal.launch.supervisor import EndReason, JobResult


class ExitCode(IntEnum):
    """Exit statuses of `shoal`. A finished job exits with its chief's code instead
    (0 when SUCCEEDED), or DEADLINE / KILLED."""

    OK = 0
    JOB_FAILED = 1
    USAGE = 2
    SPEC_ERROR = 3
    PLAN_ERROR = 4
    JOB_NOT_FOUND = 5
    ERROR = 6
    MISSING_TOOL = 7
    ENVIRONMENT = 8
    START_FAILED = 127
    DEADLINE = 124
    KILLED = 130
    PIPE_CLOSED = 141
    """128 + SIGPIPE: the reader of shoal's output went away (`shoal logs ... | head`), as for
    a program SIGPIPE ends; nothing is printed."""


def exit_code_for(error: BaseException) -> ExitCode:
    """The exit code for an error a command raised (most specific class first)."""
    if isinstance(error, UsageError):
        return ExitCode.USAGE
    if isinstance(error, SpecError):
        return ExitCode.SPEC_ERROR
    if isinstance(error, (PlanError, ClusterError)):
        return ExitCode.PLAN_ERROR
    if isinstance(error, JobNotFound):
        return ExitCode.JOB_NOT_FOUND
    if isinstance(error, StartError):
        return ExitCode.START_FAILED
    if isinstance(error, MissingTool):
        return ExitCode.MISSING_TOOL
    if isinstance(error, (WorkspaceError, OSError, RecursionError)):
        return ExitCode.ENVIRONMENT
    if isinstance(error, ShoalError):
        return ExitCode.ERROR
    raise TypeError(f"no exit code for {type(error).__name__}")


def job_exit_code(result: JobResult) -> int:
    """What `shoal train` / `run` exit with for a job that ran: 0 if it SUCCEEDED; the
    chief's code (128+N if signal N killed it) if the chief failed; 1 if another task
    did; DEADLINE, KILLED or START_FAILED."""
    reason = result.reason
    if reason is EndReason.SUCCEEDED:
        return int(ExitCode.OK)
    if reason is EndReason.CHIEF_FAILED and result.chief_exit:
        code = result.chief_exit
        return code if code > 0 else 128 - code
    if reason is EndReason.DEADLINE:
        return int(ExitCode.DEADLINE)
    if reason is EndReason.STOPPED:
        return int(ExitCode.KILLED)
    if reason is EndReason.START_FAILED:
        return int(ExitCode.START_FAILED)
    return int(ExitCode.JOB_FAILED)


def recorded_exit_code(job: JobRecord) -> int:
    """What `shoal attach` exits with for a job that is over: the code its launcher recorded
    (the one `shoal train` / `run` exited with), else by its state — a launcher that died
    before recording one leaves the job KILLED."""
    if job.exit_code is not None:
        return job.exit_code
    if job.state is JobState.SUCCEEDED:
        return int(ExitCode.OK)
    return int(ExitCode.KILLED) if job.state is JobState.KILLED else int(ExitCode.JOB_FAILED)
