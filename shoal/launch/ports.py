"""Ports for a job's tasks: `bind_ports` (held, as the agent does until a task starts) and
`free_ports` (released at once, for the local executor and for clusters started by hand).

Ports are drawn at random from below the kernel's ephemeral range, not with bind(port 0): a
port-0 bind hands out an ephemeral port, and once it is released for the task to bind, any
outgoing connection on the machine (a zmq client, a browser, another test) may be given the
same port as its local end before the task binds it ("Address already in use"). Below the
ephemeral range only another listener that picks the same port by chance can take it.
"""

from __future__ import annotations

import errno
import random
import socket
from contextlib import ExitStack
from pathlib import Path

from shoal.launch.errors import PlanError

_LOWEST = 10_000  # leave the well-known and commonly configured ports alone
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default
_TRIES_PER_PORT = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for the local end of outgoing connections (inclusive)."""
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def _candidates() -> range | None:
    """Listening ports outside the ephemeral range, or None where no sizeable range is left."""
    low, high = ephemeral_range()
    below, above = range(_LOWEST, low), range(high + 1, 65536)
    best = max(below, above, key=len)
    return best if len(best) >= 1000 else None


def bind_ports(count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """`count` TCP sockets bound to distinct free ports of `host` (not listening), for the
    caller to hold and close right before the task that uses each port binds it. Raises
    PlanError if not enough ports are free. Blocks briefly; thread-safe."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    pool = _candidates()
    rng = random.Random()
    sockets: list[socket.socket] = []
    try:
        tries = 0
        while len(sockets) < count:
            sock = socket.socket(family, socket.SOCK_STREAM)
            port = 0 if pool is None or tries >= count * _TRIES_PER_PORT else rng.choice(pool)
            tries += 1
            try:
                sock.bind((host, port))
            except OSError as e:
                sock.close()
                if port and e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            sockets.append(sock)
        return sockets
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise PlanError(f"cannot find {count} free ports on {host}: {e}") from e


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free on `host` a moment ago (all bound at once,
    then released). Blocks briefly; thread-safe."""
    with ExitStack() as stack:
        return [stack.enter_context(sock).getsockname()[1] for sock in bind_ports(count, host)]
