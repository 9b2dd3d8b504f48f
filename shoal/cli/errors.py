"""Errors raised by the CLI itself (not by the launcher library)."""

from shoal.errors import ShoalError


class MissingTool(ShoalError):
    """An optional program the command needs (TensorBoard) is not installed."""
