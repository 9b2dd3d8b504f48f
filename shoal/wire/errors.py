"""Errors raised by the transport."""

from shoal.errors import ShoalError


class WireError(ShoalError):
    """Something went wrong moving a message between two tasks."""


class ProtocolError(WireError):
    """A message did not follow the wire format (docs/wire-protocol.md)."""


class PeerTimeoutError(WireError):
    """A peer did not answer a request within its timeout (it may be dead or unreachable)."""


class AuthRejectedError(WireError):
    """A peer refused this task's credentials: the two tasks hold different job secrets."""


class RemoteError(WireError):
    """A peer answered a request with an error; the message is the peer's explanation."""


class BindError(WireError):
    """A server could not listen on its address (port in use, bad interface)."""


class SecretError(WireError):
    """The job secret is missing, empty or unreadable."""
