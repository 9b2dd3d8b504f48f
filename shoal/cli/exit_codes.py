"""`ExitCode`: every exit status `shoal` returns, and `exit_code_for` mapping errors to them."""

from __future__ import annotations

from enum import IntEnum

from shoal.cli.errors import MissingTool
from shoal.cluster import ClusterError
from shoal.errors import ShoalError
from shoal.launch.errors import JobNotFound, PlanError, SpecError, StartError


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
    START_FAILED = 127
    DEADLINE = 124
    KILLED = 130


def exit_code_for(error: ShoalError) -> ExitCode:
    """The exit code for a Shoal error (most specific class first)."""
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
    return ExitCode.ERROR
