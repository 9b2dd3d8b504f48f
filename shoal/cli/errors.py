"""Errors raised by the CLI itself (not by the launcher library)."""

from shoal.errors import ShoalError


class MissingTool(ShoalError):
    """An optional program the command needs (TensorBoard) is not installed."""


class UsageError(ShoalError):
    """The command line is wrong: an unknown command or flag, a stray word. Exit code 2."""


class KillUnverified(ShoalError):
    """`shoal kill` stopped the job, but could not verify that nothing of it is left (a host
    could not be checked, a process survived SIGKILL, Slurm did not answer). Exit code 6."""
