"""Which mechanism a connection authenticates with, and whether it is encrypted.

    PLAIN   every peer presents the same HMAC token derived from the job secret, in clear;
            traffic is not encrypted. Cheap; meant for peers on one machine.
    CURVE   CurveZMQ: both sides prove they hold key pairs derived from the job secret, and every
            frame is encrypted and authenticated with per-connection keys. Costs CPU and copies.
    AUTO    PLAIN when the address is a loopback one (127.0.0.0/8, ::1, "localhost"), CURVE
            otherwise. The default.

Both ends decide from the same cluster-spec address, so they agree without negotiating: a
server decides from the address it binds, a client from the address it connects to. The caller
chooses (configuration is read at the edge; nothing here reads the environment). See
docs/wire-protocol.md, "Security between hosts".
"""

from __future__ import annotations

import enum

from shoal.wire.endpoint import is_loopback


class Security(enum.Enum):
    """A connection's security setting. `resolve` turns AUTO into PLAIN or CURVE."""

    AUTO = "auto"
    PLAIN = "plain"
    CURVE = "curve"

    def resolve(self, address: str) -> "Security":
        """The mechanism to use for `address` ('host:port'): PLAIN or CURVE. Pure; no lookups."""
        if self is not Security.AUTO:
            return self
        return Security.PLAIN if is_loopback(address) else Security.CURVE
