"""Errors raised by parameter servers (sent back to the worker as the error of its request)."""

from shoal.errors import ShoalError


class PsError(ShoalError):
    """A parameter server refused a request or could not serve."""
