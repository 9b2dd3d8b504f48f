"""Which addresses a client treats as its own host's: shared memory is offered only to those
(shoal/wire/endpoint.py, is_on_this_host). The host's interfaces and its name lookups are
replaced by fixed ones, so every case is decided the same way on any machine."""

from __future__ import annotations

import socket
from collections import namedtuple

import psutil
import pytest

from shoal.wire import endpoint
from shoal.wire.endpoint import is_loopback, is_on_this_host

Addr = namedtuple("Addr", "family address netmask broadcast ptp")
INTERFACES = {"lo": [Addr(socket.AF_INET, "127.0.0.1", None, None, None), Addr(socket.AF_INET6, "::1", None, None, None)],
              "eth0": [Addr(socket.AF_INET, "10.77.0.2", None, None, None), Addr(socket.AF_PACKET, "aa:bb", None, None, None),
                       Addr(socket.AF_INET6, "fd00::2", None, None, None),
                       Addr(socket.AF_INET6, "fe80::2%eth0", None, None, None)]}
NAMES = {"me": ["10.77.0.2"], "me6": ["fd00::2"], "elsewhere": ["10.77.0.9"], "debian-self": ["127.0.1.1"]}


@pytest.fixture(autouse=True)
def this_host(monkeypatch):
    monkeypatch.setattr(endpoint.psutil, "net_if_addrs", lambda: INTERFACES)

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in NAMES:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0))
                for ip in NAMES[host]]
    monkeypatch.setattr(endpoint.socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("address", ["127.0.0.1:2222", "127.3.4.5:1", "localhost:80", "[::1]:9",
                                     "[::ffff:127.0.0.1]:9"])
def test_loopback_addresses_are_on_this_host(address):
    assert is_loopback(address) and is_on_this_host(address)


@pytest.mark.parametrize("address", ["10.77.0.2:2222", "[fd00::2]:2222", "[::ffff:10.77.0.2]:2222"])
def test_an_address_of_one_of_this_hosts_interfaces_is_on_this_host(address):
    assert not is_loopback(address)
    assert is_on_this_host(address)


@pytest.mark.parametrize("address", ["10.77.0.9:2222", "[fd00::9]:2222", "[::ffff:10.77.0.9]:2222", "0.0.0.0:1"])
def test_an_address_no_interface_here_holds_is_another_hosts(address):
    assert not is_on_this_host(address)


@pytest.mark.parametrize("name, here", [("me", True), ("me6", True), ("debian-self", True), ("elsewhere", False),
                                        ("no-such-host.invalid", False)])
def test_a_host_name_is_on_this_host_when_it_resolves_to_an_address_here(name, here):
    assert is_on_this_host(f"{name}:2222") is here


def test_interfaces_that_cannot_be_listed_make_every_other_address_another_hosts(monkeypatch):
    def refuse():
        raise psutil.AccessDenied()
    monkeypatch.setattr(endpoint.psutil, "net_if_addrs", refuse)
    assert not is_on_this_host("10.77.0.2:2222")
    assert is_on_this_host("127.0.0.1:2222")
