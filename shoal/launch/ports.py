"""`free_ports`: ports that are free on a host of this machine, for the local executor's
allocation (and for tests and benchmarks that start clusters by hand)."""

from __future__ import annotations

import socket
from contextlib import ExitStack

from shoal.launch.errors import PlanError


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free on `host` a moment ago (all bound at once,
    then released). Blocks briefly; thread-safe."""
    try:
        with ExitStack() as stack:
            ports = []
            for _ in range(count):
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.bind((host, 0))
                ports.append(sock.getsockname()[1])
            return ports
    except OSError as e:
        raise PlanError(f"cannot find {count} free ports on {host}: {e}") from e
