"""The error raised by `shoal.cluster` for every bad cluster or task description."""

from shoal.errors import ShoalError


class ClusterError(ShoalError):
    """A cluster spec, TF_CONFIG or cluster flag is malformed or inconsistent.

    The message names the bad value (and where it came from: `cluster.worker[1]`,
    `TF_CONFIG task.index`, `--job_name`) and says how to fix it.
    """
