"""create_local_server: a one-process cluster (one ps thread + this process as the chief)."""

from __future__ import annotations

import secrets
import socket

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.ps.server import Server
from shoal.wire import JobSecret


class LocalCluster:
    """A ps served from a background thread of this process, for quick experiments.

    `config` is the ClusterConfig of this process as the chief; pass it and `secret` to
    TrainingSession. `close()` stops the ps (idempotent); also a context manager.
    """

    def __init__(self, server: Server, config: ClusterConfig, secret: JobSecret):
        self.server, self.config, self.secret = server, config, secret

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.server.stop()


def create_local_server() -> LocalCluster:
    """Start a ps on a free loopback port, in this process. Returns at once; does not block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ClusterSpec.from_dict({"ps": [f"127.0.0.1:{port}"], "chief": ["127.0.0.1:0"]})
    secret = JobSecret(secrets.token_hex(32).encode(), "create_local_server")
    server = Server(spec, "ps", 0, secret=secret).start()
    return LocalCluster(server, ClusterConfig(spec, TaskId("chief", 0)), secret)
