"""The two ways a Shoal socket authenticates: set up on each side, and the server's check.

A Mechanism configures a server socket, a client socket, and answers the server's ZAP question
"are these credentials this job's?" (the Gatekeeper asks it). Keys and tokens come from the job
secret (shoal/wire/secret.py); the secret itself never leaves the process.
"""

from __future__ import annotations

import hmac
import logging
from typing import Protocol

import zmq

from shoal.wire.endpoint import is_loopback
from shoal.wire.secret import USERNAME, JobSecret
from shoal.wire.security import Security

log = logging.getLogger(__name__)


class Mechanism(Protocol):
    security: Security

    def configure_server(self, sock: zmq.Socket) -> None: ...

    def configure_client(self, sock: zmq.Socket) -> None: ...

    def check(self, mechanism: bytes, credentials: list[bytes]) -> bool: ...


class PlainMechanism:
    """zmq PLAIN with the job's HMAC token as the password. Not encrypted."""

    security = Security.PLAIN

    def __init__(self, secret: JobSecret):
        self._secret = secret

    def configure_server(self, sock: zmq.Socket) -> None:
        sock.plain_server = True

    def configure_client(self, sock: zmq.Socket) -> None:
        sock.plain_username = USERNAME
        sock.plain_password = self._secret.token()

    def check(self, mechanism: bytes, credentials: list[bytes]) -> bool:
        return mechanism == b"PLAIN" and self._secret.plain_credentials_ok(credentials)


class CurveMechanism:
    """CurveZMQ with the job's derived key pairs: the client must know the server's public key
    to start the handshake, and the server accepts only the job's client public key."""

    security = Security.CURVE

    def __init__(self, secret: JobSecret):
        self._server = secret.curve_server_keys()
        self._client = secret.curve_client_keys()

    def configure_server(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_secretkey = self._server.secret
        sock.curve_publickey = self._server.public

    def configure_client(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self._server.public
        sock.curve_publickey = self._client.public
        sock.curve_secretkey = self._client.secret

    def check(self, mechanism: bytes, credentials: list[bytes]) -> bool:
        return (mechanism == b"CURVE" and len(credentials) == 1
                and hmac.compare_digest(credentials[0], self._client.public_raw))


def mechanism_for(security: Security, address: str, secret: JobSecret) -> Mechanism:
    """The mechanism `security` means for a connection to or on `address`. Forcing PLAIN on an
    address that is not loopback is allowed (a network the job trusts) and logged as a warning."""
    if security.resolve(address) is Security.CURVE:
        return CurveMechanism(secret)
    if not is_loopback(address):
        log.warning("%s: security PLAIN between hosts: traffic is not encrypted and the job's token travels in "
                    "clear; use AUTO or CURVE unless the network is trusted", address)
    return PlainMechanism(secret)
