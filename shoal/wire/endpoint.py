"""Turning `host:port` into zmq endpoints for binding and connecting."""

from __future__ import annotations

import ipaddress
import socket

import psutil

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


def all_loopback(addresses) -> bool:
    """Whether `addresses` is not empty and every one is a loopback one (`is_loopback`): the
    job's tasks on one machine, as every task decides alike from the cluster spec's text."""
    return bool(addresses) and all(is_loopback(address) for address in addresses)


def is_on_this_host(address: str) -> bool:
    """Whether `address` reaches a server in this network namespace: a loopback address, or one
    held by an interface here (a host's own address, as the SSH executor writes into TF_CONFIG
    for a worker next to its ps). Blocks on a name lookup for a host name; False if it fails.

    Only a hint for sharing memory: the server still checks through /proc that the client is a
    process it can reach, so a namespace that hides one from the other falls back to the socket."""
    if is_loopback(address):
        return True
    host, _ = split_address(address)
    try:
        ips = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            ips = {ipaddress.ip_address(info[4][0].split("%")[0])
                   for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        except (OSError, UnicodeError, ValueError):
            return False
    ips = {getattr(ip, "ipv4_mapped", None) or ip for ip in ips}
    # (a scoped IPv6 address, fe80::1%eth0, compares unequal to its interface's: False, the socket)
    return any(ip.is_loopback for ip in ips) or bool(ips & _interface_ips())


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _interface_ips() -> set[IpAddress]:
    """The addresses of this network namespace's interfaces (none if they cannot be listed)."""
    ips: set[IpAddress] = set()
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, RuntimeError, psutil.Error):  # cannot list them: treat the address as another host's
        return ips
    for addrs in interfaces.values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    ips.add(ipaddress.ip_address(addr.address.split("%")[0]))
                except ValueError:
                    continue
    return ips


def is_ipv6(address: str) -> bool:
    host, _ = split_address(address)
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
