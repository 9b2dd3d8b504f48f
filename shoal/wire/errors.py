"""Errors raised by the transport."""

from shoal.errors import ShoalError


class WireError(ShoalError):
    """Something went wrong moving a message between two tasks."""


class ProtocolError(WireError):
    """A message did not follow the wire format (docs/wire-protocol.md)."""


class PeerTimeoutError(WireError):
    """A peer did not answer a request within its timeout (it may be dead or unreachable)."""


class PeerLostError(WireError):
    """The connection to a peer broke while a request was in flight (the peer process died or
    its machine went away). The request may or may not have been handled; `peer_name` says who."""

    def __init__(self, message: str, peer_name: str):
        super().__init__(message)
        self.peer_name = peer_name


class AuthRejectedError(WireError):
    """A peer refused this task's credentials: the two tasks hold different job secrets, or use
    different security settings (PLAIN vs CURVE). The message says which it looks like."""


class RemoteError(WireError):
    """A peer answered a request with an error; the message is the peer's explanation."""

    def __init__(self, message: str, peer_name: str = ""):
        super().__init__(message)
        self.peer_name = peer_name


class BindError(WireError):
    """A server could not listen on its address (port in use, bad interface)."""


class SecretError(WireError):
    """The job secret is missing, empty or unreadable."""
