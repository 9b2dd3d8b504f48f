"""Doorbell lines between a client and a server on this machine (shoal/wire/doorbell.py): once
the server attached a client's area, requests that are a header alone (their tensors in the
area) skip zmq, replies too big for their block still come back through zmq, a request waiting
on zmq keeps the next ones on zmq, and a server that went is noticed as lost. A process that
connects to the doorbell without being an attached client is hung up on, and only so many such
lines are held. Real echo server processes (tests/cluster/programs/wire_echo.py), which print
which way each request came."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from shoal.wire import PeerLostError
from shoal.wire.bell_desk import HELLO_TIMEOUT_S, MAX_UNBOUND
from shoal.wire.doorbell import BELL_MAX_BYTES, BellState, address_of
from shoal.wire.shared_area import AREA_BYTES, BLOCK_KEY, NONCE_BYTES
from tests.cluster.harness import drain_disconnect_while_idle
from tests.cluster.relay import Relay
from tests.cluster.test_wire_shared_memory import attached  # noqa: F401 (a fixture, used by `rung`)
from tests.cluster.test_wire_shared_memory import BIG, client, echo_server, wait_until


@pytest.fixture
def rung(attached):
    """(server task, client, cluster) with the client's doorbell line up (the client's area is
    attached: the reply to the request that offered it named the doorbell)."""
    c = attached.client
    assert wait_until(lambda: c.call("ping") is not None and c.bell_state is BellState.UP, 10)
    return attached.server, c, attached.cluster


def doorbell_ways(task, op: str) -> tuple[int, int]:
    """How many `op` requests the server handled (on the doorbell, through zmq)."""
    lines = task.output().splitlines()
    bell = sum(line == f"handled {op} on the doorbell" for line in lines)
    return bell, sum(line == f"handled {op}" for line in lines)


def test_requests_that_are_a_header_alone_go_on_the_doorbell_and_tensors_through_the_area(rung):
    task, c, cluster = rung
    for k in range(3):
        assert c.call("ping", {"k": k}).header["echo"] == "ping"
        x = np.arange(BIG, dtype=np.float32) + k
        reply = c.call("echo", tensors={"x": x, "b": np.full(3, k, np.float32)})
        assert BLOCK_KEY in reply.header
        np.testing.assert_array_equal(reply.tensors["x"], x)
        np.testing.assert_array_equal(reply.tensors["b"], np.full(3, k))
    small = c.call("echo", tensors={"b": np.arange(3, dtype=np.float32)})  # small ones go in the area too now
    assert BLOCK_KEY in small.header and small.tensors["b"].tolist() == [0, 1, 2]
    assert wait_until(lambda: doorbell_ways(task, "echo")[0] == 4, 10), task.output()[-2000:]
    assert doorbell_ways(task, "ping")[0] >= 3


def test_a_reply_too_big_for_its_block_comes_through_zmq(rung):
    task, c, cluster = rung
    x = np.arange(BIG, dtype=np.float32)
    grown = c.call("grow", tensors={"x": x})
    assert BLOCK_KEY not in grown.header
    np.testing.assert_array_equal(grown.tensors["x"], np.concatenate([x, x]))
    assert wait_until(lambda: doorbell_ways(task, "grow") == (1, 0), 10), "the request itself came on the doorbell"
    assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP


def test_requests_out_together_each_get_their_own_reply(rung):
    task, c, cluster = rung
    sent = [np.full(BIG, k, np.float32) for k in range(4)]
    rids = [c.send("echo", tensors={"x": s}) for s in sent] + [c.send("ping", {"k": k}) for k in range(4)]
    replies = [c.wait(rid) for rid in reversed(rids)][::-1]
    assert [r.rid for r in replies] == rids
    for reply, want in zip(replies, sent):
        np.testing.assert_array_equal(reply.tensors["x"], want)
    assert [r.header["echo"] for r in replies] == ["echo"] * 4 + ["ping"] * 4
    assert wait_until(lambda: doorbell_ways(task, "echo")[0] >= 4, 10)


def test_a_request_waiting_on_zmq_keeps_the_next_ones_on_zmq(rung):
    task, c, cluster = rung
    bell, through_zmq = doorbell_ways(task, "ping")
    half = np.ones(AREA_BYTES // 2 // 4, np.float32)
    rids = [c.send("echo", tensors={"x": half}) for _ in range(2)]  # the second does not fit the area: zmq
    after = c.send("ping")  # so this one follows it on zmq, in order
    for rid in [*rids, after]:
        c.wait(rid)
    assert wait_until(lambda: doorbell_ways(task, "ping") == (bell, through_zmq + 1), 10), task.output()[-2000:]
    c.call("ping")  # nothing waits on zmq any more: back on the doorbell
    assert wait_until(lambda: doorbell_ways(task, "ping") == (bell + 1, through_zmq + 1), 10)


def test_a_server_that_dies_while_a_request_is_out_on_the_doorbell_is_reported_lost(rung):
    task, c, cluster = rung
    rid = c.send("hold")  # the server never answers it
    assert wait_until(lambda: doorbell_ways(task, "hold") == (1, 0), 10)
    os.killpg(task.proc.pid, signal.SIGKILL)
    with pytest.raises(PeerLostError, match="lost the connection"):  # (not a timeout: zmq's monitor saw it go)
        c.wait(rid, timeout_s=60)
    assert c.bell_state is None


def _doorbell_name(c) -> str:
    return c._bell.name  # (the address a process that lists /proc/net/unix would find)


def _connect(name: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(address_of(name))
    except BlockingIOError:  # the listen queue is full: never accepted
        s.close()
        return None
    return s


def _hung_up(s: socket.socket) -> bool:
    try:
        return s.recv(64, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_hello_that_is_not_the_area_of_the_process_that_rings_is_hung_up_on(rung):
    task, c, cluster = rung
    name = _doorbell_name(c)
    wrong = _connect(name)  # this process holds an area, but this is not its nonce
    try:
        wrong.send(os.urandom(NONCE_BYTES))
        assert wait_until(lambda: _hung_up(wrong), 10), "a hello with a nonce of no area must be hung up on"
    finally:
        wrong.close()
    # the right nonce, from a process that holds no area: hung up on before a byte is read
    nonce = c._area.offer()["nonce"]
    other = subprocess.run([sys.executable, "-c", OTHER_PROCESS, name], input=nonce, capture_output=True, timeout=30)
    assert other.stdout.strip() == b"hung up", other
    assert wait_until(lambda: "holds no area this server attached" in task.output(), 10), task.output()[-2000:]
    assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP


def test_silent_lines_are_few_and_short_lived(rung):
    task, c, cluster = rung
    name = _doorbell_name(c)
    lines = [s for s in (_connect(name) for _ in range(MAX_UNBOUND + 6)) if s is not None]
    try:
        assert len(lines) > MAX_UNBOUND
        assert wait_until(lambda: sum(_hung_up(s) for s in lines) >= len(lines) - MAX_UNBOUND, 10), \
            "at most MAX_UNBOUND lines that said nothing are held"
        assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP
        assert wait_until(lambda: all(_hung_up(s) for s in lines), HELLO_TIMEOUT_S + 5), \
            "a line that says nothing is hung up on after HELLO_TIMEOUT_S"
    finally:
        for s in lines:
            s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to ring the doorbell as another user")
def test_lines_of_another_user_cannot_keep_a_new_client_off_the_doorbell(rung):
    task, c, cluster = rung
    # (the system's interpreter: a virtual environment under root's home is not the other user's to run)
    flood = subprocess.Popen(["/usr/bin/python3", "-c", FLOOD, _doorbell_name(c)], user=65534, group=65534,
                             cwd="/", env={}, stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([flood.stdout], [], [], 30)[0], "the flooding process said nothing within 30 s"
        assert flood.stdout.readline().strip() == "flooding"
        newcomer = client(cluster, cluster.spec["ps"][0])
        try:
            newcomer.call("echo", tensors={"x": np.zeros(BIG, np.float32)})
            assert wait_until(lambda: newcomer.call("ping") is not None and newcomer.bell_state is BellState.UP, 10), \
                "another user's lines kept a new client off the doorbell"
        finally:
            newcomer.close()
        assert "another user's" in task.output()
    finally:
        flood.kill()
        flood.wait(10)


FLOOD = """
import socket, sys, time
print("flooding", flush=True)
held = []
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(b"\\0" + sys.argv[1].encode())
        held.append(s)
    except OSError:
        s.close()
    held = held[-64:]
    time.sleep(0.002)
"""

OTHER_PROCESS = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(b"\\0" + sys.argv[1].encode())
try:
    s.send(sys.stdin.buffer.read())
    s.settimeout(10)
    print("hung up" if s.recv(64) == b"" else "answered", flush=True)
except (BrokenPipeError, ConnectionResetError):
    print("hung up", flush=True)
"""


def test_a_reply_through_zmq_finds_its_client_after_zmq_connected_again(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    host, port = address.rsplit(":", 1)
    relay = Relay((host, int(port)))
    c = client(cluster, relay.address)
    try:
        x = np.arange(BIG, dtype=np.float32)
        c.call("echo", tensors={"x": x})
        assert wait_until(lambda: c.call("ping") is not None and c.bell_state is BellState.UP, 10)
        relay.cut()  # the TCP connection drops while nothing waits; both processes live on
        drain_disconnect_while_idle(c)
        assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP
        grown = c.call("grow", tensors={"x": x}, timeout_s=10)  # its reply comes through zmq, reconnected
        np.testing.assert_array_equal(grown.tensors["x"], np.concatenate([x, x]))
    finally:
        c.close()
        relay.stop()


def test_a_request_through_zmq_is_handled_after_those_sent_before_it_on_the_line(rung):
    task, c, cluster = rung
    slow = c.send("slow")  # keeps the server busy while the next two queue
    first = c.send("ping")  # on the line
    second = c.send("echo", {"pad": "x" * (BELL_MAX_BYTES + 1)})  # a header too big for the line: zmq
    for rid in (slow, first, second):
        c.wait(rid)
    handled = [line for line in task.output().splitlines() if line.startswith("handled ")]
    assert handled[-3:] == ["handled slow on the doorbell", "handled ping on the doorbell", "handled echo"], handled


def test_a_server_that_stops_reading_does_not_block_the_client(rung):
    task, c, cluster = rung
    os.kill(task.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        rids = [c.send("ping", {"k": k}) for k in range(2000)]  # more than the line holds: the rest go to zmq
        assert time.monotonic() - started < 10, "sending must not wait for the server"
    finally:
        os.kill(task.proc.pid, signal.SIGCONT)
    replies = [c.wait(rid) for rid in rids]
    assert [r.rid for r in replies] == rids
    bell, through_zmq = doorbell_ways(task, "ping")
    assert bell > 0 and through_zmq > 0, (bell, through_zmq)


def test_a_client_rings_the_doorbell_of_a_server_started_again_and_after_a_reset(rung):
    task, c, cluster = rung
    os.killpg(task.proc.pid, signal.SIGKILL)
    task.proc.wait(10)
    drain_disconnect_while_idle(c)
    again, _ = echo_server(cluster)
    x = np.zeros(BIG, np.float32)
    c.call("echo", tensors={"x": x})  # the new server attaches the area and names its doorbell
    assert wait_until(lambda: c.call("ping") is not None and c.bell_state is BellState.UP, 10)
    c.call("ping")
    assert wait_until(lambda: doorbell_ways(again, "ping")[0] == 1, 10)
    c.reset()
    assert c.bell_state is None
    c.call("echo", tensors={"x": x})
    assert wait_until(lambda: c.call("ping") is not None and c.bell_state is BellState.UP, 10)


def test_a_server_that_refuses_shared_memory_names_no_doorbell(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster, "--no-shared-memory")
    c = client(cluster, address)
    try:
        for _ in range(3):
            reply = c.call("echo", tensors={"x": np.ones(BIG, np.float32)})
            assert "bell" not in reply.header
            c.call("ping")
        assert c.bell_state is None and doorbell_ways(task, "ping") == (0, 3)
    finally:
        c.close()
