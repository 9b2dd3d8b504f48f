"""The job secret that tasks of one job share, and the credentials derived from it.

Where the secret comes from (first match wins):

1. `SHOAL_JOB_SECRET` — the secret itself (the launcher sets a fresh one per job);
2. `SHOAL_JOB_SECRET_FILE` — a file holding it;
3. `$SHOAL_HOME/job_secret` (default `~/.shoal/job_secret`) — created with mode 0600 on first
   use, like Erlang's cookie, so tasks a user starts by hand on one machine agree without setup.

The secret itself never crosses the network: peers present an HMAC-derived token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from shoal.wire.errors import SecretError

_TOKEN_CONTEXT = b"shoal-plain-token-v1"
USERNAME = b"shoal"


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

    def plain_credentials_ok(self, credentials: list[bytes]) -> bool:
        """Whether ZAP PLAIN credentials [username, password] are this job's. Constant time."""
        return (len(credentials) == 2 and credentials[0] == USERNAME
                and hmac.compare_digest(credentials[1], self.token()))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "JobSecret":
        """Read the secret as described in the module docstring. May create the default file."""
        if "SHOAL_JOB_SECRET" in environ:
            return cls(environ["SHOAL_JOB_SECRET"].encode(), "SHOAL_JOB_SECRET")
        if "SHOAL_JOB_SECRET_FILE" in environ:
            return _read_file(Path(environ["SHOAL_JOB_SECRET_FILE"]), "SHOAL_JOB_SECRET_FILE")
        home = Path(environ.get("SHOAL_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".shoal")
        return _read_or_create(home / "job_secret")


def _read_file(path: Path, what: str) -> JobSecret:
    try:
        value = path.read_bytes().strip()
    except OSError as e:
        raise SecretError(f"cannot read the job secret file {path} named by {what}: {e.strerror}; "
                          "create it (e.g. `openssl rand -hex 32 > FILE`) or fix the path") from e
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
