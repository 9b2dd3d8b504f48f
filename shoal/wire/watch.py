"""What a client's socket monitor says about its connection: refused, lost, or fine.

zmq retries a failed connection by itself; only its monitor events tell a client that retrying
is pointless (the server refused our credentials, or speaks another mechanism) or that a request
went down with a connection.
"""

from __future__ import annotations

import zmq

from shoal.wire.security import Security

# Monitor events a client subscribes to.
EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_DISCONNECTED)

# A CURVE server that cannot decrypt our HELLO (it holds keys from another secret) just hangs up:
# zmq reports no reason; so, often, does a CURVE server greeted by a PLAIN client. A server
# restarting, or shedding unauthenticated connections, can hang up once or twice too, so only
# this many in a row, with no success between, mean "refused".
CURVE_HANGUPS_MEANING_REFUSED = 3


class ConnectionWatch:
    """Interprets one client connection's monitor events. Not thread-safe (the client's thread)."""

    def __init__(self, peer_name: str, address: str, security: Security):
        self._who = f"{peer_name} at {address}"
        self.security = security
        self.refusal: str | None = None  # why the server will never accept us, once we know
        self.lost = False                # a connection that was up broke while requests were out
        self._up = False                 # the current connection finished its handshake
        self.dropped = 0                 # connections that finished their handshake and then broke
        self._hangups = 0                # handshakes the server hung up on, in a row

    @property
    def up(self) -> bool:
        """The connection finished its handshake and has not broken since (as far as the events read say)."""
        return self._up

    def on_event(self, event: int, value: int, pending: bool) -> None:
        """Take one monitor event; `pending` says whether requests are waiting for replies."""
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._up, self._hangups = True, 0
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.refusal = (f"{self._who} rejected this task's job secret; give every task of the job the same "
                            "SHOAL_JOB_SECRET (or SHOAL_JOB_SECRET_FILE)")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            self.refusal = (f"{self._who} failed the {self.security.name} handshake (zmq protocol error {value:#x}): "
                            "the two tasks use different security settings (AUTO means PLAIN for loopback addresses "
                            "and CURVE otherwise), hold different job secrets (SHOAL_JOB_SECRET), or run different "
                            "Shoal versions")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._hangups += 1
            if self._hangups < CURVE_HANGUPS_MEANING_REFUSED:
                pass
            elif self.security is Security.CURVE:
                self.refusal = (f"{self._who} hung up on {self._hangups} CURVE handshakes in a row: it cannot "
                                "decrypt this task's hello, so the two tasks hold different job secrets, or it does "
                                "not use CURVE (a PLAIN server: AUTO means PLAIN for loopback addresses); give every "
                                "task of the job the same SHOAL_JOB_SECRET (or SHOAL_JOB_SECRET_FILE) and the same "
                                "--wire_security")
            else:  # a CURVE server hangs up on a PLAIN hello as often as it says why (PROTOCOL above)
                self.refusal = (f"{self._who} hung up on {self._hangups} {self.security.name} handshakes in a row: "
                                "the two tasks use different security settings (AUTO means PLAIN for loopback "
                                "addresses and CURVE otherwise; --wire_security must be the same for every task)")
        elif event == zmq.EVENT_DISCONNECTED:
            # Only a connection that was up can have taken a request with it. One dropped during
            # its handshake (a server shedding unauthenticated connections under load) delivered
            # nothing: zmq reconnects and sends the queued requests.
            if self._up and pending:
                self.lost = True
            self.dropped += self._up
            self._up = False
