"""Ports for tasks come from outside the kernel's ephemeral range, so that no outgoing
connection on the machine can be given a task's port between its allocation and its bind."""

import socket

import pytest

from shoal.launch.errors import PlanError
from shoal.launch.ports import bind_ports, ephemeral_range, free_ports


def test_task_ports_are_distinct_and_outside_the_ephemeral_range():
    low, high = ephemeral_range()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(not low <= p <= high for p in ports), (low, high, ports)


def test_bound_ports_are_held_until_closed():
    (held,) = bind_ports(1)
    port = held.getsockname()[1]
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    held.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))


def test_an_address_of_no_interface_is_a_plan_error_naming_it():
    with pytest.raises(PlanError, match="cannot find 1 free ports on 192.0.2.1"):
        bind_ports(1, "192.0.2.1")
