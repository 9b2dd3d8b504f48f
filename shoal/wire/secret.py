"""The job secret that tasks of one job share, and the credentials derived from it.

Where the secret comes from (first match wins):

1. `SHOAL_JOB_SECRET` — the secret itself (the launcher sets a fresh one per job);
2. `SHOAL_JOB_SECRET_FILE` — a file holding it;
3. `<home>/job_secret`, where the caller passes Shoal's home (`shoal.home.shoal_home`:
   `$SHOAL_HOME`, default `~/.shoal`) — created with mode 0600 on first use, like Erlang's
   cookie, so tasks a user starts by hand on one machine agree without setup.

Programs resolve it once, at their edge: `shoal.resolve_job_secret(os.environ)`.

A secret file that others may read (any group or other permission bit) is refused, as ssh
refuses such a private key: fix it with `chmod 600 FILE`.

The secret itself never crosses the network. Peers on one machine present an HMAC-derived token
(PLAIN); peers on different machines authenticate with CurveZMQ key pairs derived from it
(`curve_server_keys`, `curve_client_keys`; see docs/wire-protocol.md, "Security between hosts").
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import zmq
from zmq.utils import z85

from shoal.wire.errors import SecretError

_TOKEN_CONTEXT = b"shoal-plain-token-v1"
USERNAME = b"shoal"
# HKDF-SHA256 (RFC 5869) salt and per-role labels for the CURVE secret keys: distinct labels give
# the server and the clients different, unrelated key pairs from the one job secret.
_CURVE_SALT = b"shoal-curve-v1"
_CURVE_SERVER_LABEL = b"shoal-curve-server-key"
_CURVE_CLIENT_LABEL = b"shoal-curve-client-key"


@dataclass(frozen=True)
class CurveKeys:
    """A Curve25519 key pair, both halves Z85-encoded (40 characters) as zmq takes them."""

    public: bytes
    secret: bytes = field(repr=False)

    @property
    def public_raw(self) -> bytes:
        """The 32 bytes of the public key (what ZAP hands a server for a CURVE client)."""
        return z85.decode(self.public)


@dataclass(frozen=True)
class JobSecret:
    """A job's shared secret. `source` says where it came from, for log lines."""

    value: bytes = field(repr=False)
    source: str

    def __post_init__(self) -> None:
        if not self.value:
            raise SecretError(f"the job secret from {self.source} is empty; put a random string in it "
                              "(e.g. `openssl rand -hex 32`)")

    def token(self) -> bytes:
        """The credential a task presents to its peers (not the secret itself)."""
        return hmac.new(self.value, _TOKEN_CONTEXT, hashlib.sha256).hexdigest().encode()

    def curve_server_keys(self) -> CurveKeys:
        """The key pair every server of this job uses (clients know its public half)."""
        return _curve_keys(self.value, _CURVE_SERVER_LABEL)

    def curve_client_keys(self) -> CurveKeys:
        """The key pair every client of this job uses (servers accept only its public half)."""
        return _curve_keys(self.value, _CURVE_CLIENT_LABEL)

    def plain_credentials_ok(self, credentials: list[bytes]) -> bool:
        """Whether ZAP PLAIN credentials [username, password] are this job's. Constant time."""
        return (len(credentials) == 2 and credentials[0] == USERNAME
                and hmac.compare_digest(credentials[1], self.token()))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], home: Path) -> "JobSecret":
        """Read the secret as described in the module docstring, with `home` as Shoal's home
        directory. May create the default file. Blocks on the filesystem."""
        if "SHOAL_JOB_SECRET" in environ:
            return cls(environ["SHOAL_JOB_SECRET"].encode(), "SHOAL_JOB_SECRET")
        if "SHOAL_JOB_SECRET_FILE" in environ:
            return _read_file(Path(environ["SHOAL_JOB_SECRET_FILE"]), "SHOAL_JOB_SECRET_FILE")
        return _read_or_create(home / "job_secret")


def _curve_keys(secret: bytes, label: bytes) -> CurveKeys:
    prk = hmac.new(_CURVE_SALT, secret, hashlib.sha256).digest()        # HKDF-Extract
    key = hmac.new(prk, label + b"\x01", hashlib.sha256).digest()       # HKDF-Expand, one block
    secret_z85 = z85.encode(key)  # Curve25519 clamps the scalar itself; any 32 bytes are a key
    return CurveKeys(zmq.curve_public(secret_z85), secret_z85)


def _read_file(path: Path, what: str) -> JobSecret:
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            value = f.read().strip()
    except OSError as e:
        raise SecretError(f"cannot read the job secret file {path} named by {what}: {e.strerror}; "
                          "create it (e.g. `openssl rand -hex 32 > FILE`) or fix the path") from e
    if mode & 0o077:
        raise SecretError(f"the job secret file {path} named by {what} can be read or changed by others "
                          f"(mode {mode:04o}); anyone who reads it can join the job: "
                          f"chmod 600 {path}")
    return JobSecret(value, f"{what}={path}")


def _read_or_create(path: Path) -> JobSecret:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
        try:
            os.link(tmp, path)  # atomic: if another task won the race we read its secret
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return _read_file(path, "the default secret file")
