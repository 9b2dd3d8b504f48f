"""Turning `host:port` into zmq endpoints for binding and connecting."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port). The caller validated the form already."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def connect_endpoint(address: str) -> str:
    """The zmq endpoint a client connects to for `address`."""
    host, port = split_address(address)
    return f"tcp://{_bracket(host)}:{port}"


def bind_endpoint(address: str) -> str:
    """The zmq endpoint a server binds for `address`.

    Loopback names bind 127.0.0.1 only, so a single-machine job never listens outside the
    machine; a literal IP binds that IP; any other host name binds all interfaces (the name may
    resolve differently elsewhere), which is what TensorFlow's servers do.
    """
    host, port = split_address(address)
    if host in LOOPBACK_NAMES:
        return f"tcp://127.0.0.1:{port}"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"tcp://*:{port}"
    return f"tcp://{_bracket(host)}:{port}"


def is_loopback(address: str) -> bool:
    """Whether `address` names this machine's loopback: a loopback name, 127.0.0.0/8 or ::1.
    Decided on the text alone (no name lookup), so both ends of a connection agree."""
    host, _ = split_address(address)
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def is_ipv6(address: str) -> bool:
    host, _ = split_address(address)
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
