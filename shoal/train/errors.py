"""Errors raised on the worker side."""

from shoal.errors import ShoalError


class TrainError(ShoalError):
    """A worker could not set up or continue training."""
