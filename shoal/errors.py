"""The one base error of Shoal. Each package raises its own subclasses of `ShoalError`.

Every message names the bad value and says how to fix it. Only `shoal.cli` turns these into
exit codes.
"""


class ShoalError(Exception):
    """Base class of every error Shoal raises on purpose."""
