"""Which addresses a client treats as its own host's (shared memory is offered only to those)."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import pytest

from shoal.wire.endpoint import is_loopback, is_on_this_host


def _own_addresses(family: int) -> list[str]:
    return [a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == family]


@pytest.mark.parametrize("address", ["127.0.0.1:2222", "127.3.4.5:1", "localhost:80", "[::1]:9",
                                     "[::ffff:127.0.0.1]:9"])
def test_loopback_addresses_are_on_this_host(address):
    assert is_loopback(address) and is_on_this_host(address)


def test_an_address_of_one_of_this_hosts_interfaces_is_on_this_host_without_being_loopback():
    own = [ip for ip in _own_addresses(socket.AF_INET) if not ipaddress.ip_address(ip).is_loopback]
    if not own:
        pytest.skip("this host has no IPv4 address besides loopback")
    assert not is_loopback(f"{own[0]}:2222")
    assert is_on_this_host(f"{own[0]}:2222")
    assert is_on_this_host(f"[::ffff:{own[0]}]:2222")  # the same address, v4-mapped


def test_an_address_no_interface_here_holds_is_not_on_this_host():
    own = set(_own_addresses(socket.AF_INET))
    other = next(f"198.51.100.{n}" for n in range(1, 255) if f"198.51.100.{n}" not in own)
    assert not is_on_this_host(f"{other}:2222")


def test_a_name_is_looked_up_and_a_name_that_does_not_resolve_is_not_on_this_host():
    assert is_on_this_host(f"{socket.gethostname()}:2222") is any(
        ipaddress.ip_address(info[4][0].split("%")[0]) in {ipaddress.ip_address(a) for a in
                                                          _own_addresses(info[0])}
        for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP))
    assert not is_on_this_host("no-such-host.invalid:2222")
