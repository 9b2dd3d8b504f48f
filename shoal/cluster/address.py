"""Validation of task addresses: "host:port" with a hostname, IPv4 or [IPv6] host.

Pure string checks, no name resolution; thread-safe.
"""

from __future__ import annotations

import ipaddress
import re

from shoal.cluster.errors import ClusterError

_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_PORT_RE = re.compile(r"[0-9]{1,5}")


def split_address(address: object, where: str) -> tuple[str, int]:
    """Check `address` and return (host, port); `where` names it in errors.

    `where` is e.g. "cluster.worker[1]" or "--ps_hosts entry 0"; errors read
    "cluster.worker[1] = 'host1' is not a valid address: ...; write it as host:port".
    """
    if not isinstance(address, str):
        _fail(where, address, "it is not a string")
    host, sep, port = address.rpartition(":")
    if not sep:
        _fail(where, address, "it has no ':port'")
    if not _PORT_RE.fullmatch(port) or int(port) > 65535:
        _fail(where, address, f"port {port!r} is not an integer in 0..65535")
    _check_host(host, where, address)
    return host, int(port)


def _check_host(host: str, where: str, address: str) -> None:
    if not host:
        _fail(where, address, "the host is empty")
    if host.startswith("["):
        if host.endswith("]"):
            try:
                ipaddress.IPv6Address(host[1:-1])
                return
            except ValueError:
                pass
        _fail(where, address, f"{host!r} is not a bracketed IPv6 address like '[::1]'")
    if ":" in host:
        _fail(where, address, "an IPv6 host must be in brackets, e.g. '[::1]:2222'")
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
            return
        except ValueError:
            _fail(where, address, f"{host!r} is not a valid IPv4 address")
    if not _HOSTNAME_RE.fullmatch(host):
        _fail(where, address, f"{host!r} is not a valid hostname")


def _fail(where: str, address: object, why: str) -> None:
    raise ClusterError(
        f"{where} = {address!r} is not a valid address: {why};"
        " write it as host:port, e.g. 'localhost:2222'"
    )
