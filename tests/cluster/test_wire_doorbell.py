"""Doorbell lines between a client and a server on this machine (shoal/wire/doorbell.py): once
the server attached a client's area, requests that are a header alone (their tensors in the
area) skip zmq, replies too big for their block still come back through zmq, a request waiting
on zmq keeps the next ones on zmq, and a server that went is noticed as lost. A process that
connects to the doorbell without being an attached client is hung up on, and only so many such
lines are held. Real echo server processes (tests/cluster/programs/wire_echo.py), which print
which way each request came."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from shoal.wire import PeerLostError
from shoal.wire.bell_desk import HELLO_TIMEOUT_S, MAX_UNBOUND
from shoal.wire.doorbell import BellState, address_of
from shoal.wire.shared_area import AREA_BYTES, BLOCK_KEY, NONCE_BYTES, AreaState
from shoal.wire.shared_attach import SWEEP_EVERY_S
from tests.cluster.test_wire_shared_memory import BIG, client, echo_server, wait_until


@pytest.fixture
def rung(make_cluster):
    """(server task, client) with the client's doorbell line up."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address)
    try:
        c.call("echo", tensors={"x": np.zeros(BIG, np.float32)})  # offers the area: the reply names the doorbell
        assert c.shared_state is AreaState.ATTACHED
        assert wait_until(lambda: c.call("ping") is not None and c.bell_state is BellState.UP, 10)
        yield task, c
    finally:
        c.close()


def doorbell_ways(task, op: str) -> tuple[int, int]:
    """How many `op` requests the server handled (on the doorbell, through zmq)."""
    lines = task.output().splitlines()
    bell = sum(line == f"handled {op} on the doorbell" for line in lines)
    return bell, sum(line == f"handled {op}" for line in lines)


def test_requests_that_are_a_header_alone_go_on_the_doorbell_and_tensors_through_the_area(rung):
    task, c = rung
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
    task, c = rung
    x = np.arange(BIG, dtype=np.float32)
    grown = c.call("grow", tensors={"x": x})
    assert BLOCK_KEY not in grown.header
    np.testing.assert_array_equal(grown.tensors["x"], np.concatenate([x, x]))
    assert wait_until(lambda: doorbell_ways(task, "grow") == (1, 0), 10), "the request itself came on the doorbell"
    assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP


def test_requests_out_together_each_get_their_own_reply(rung):
    task, c = rung
    sent = [np.full(BIG, k, np.float32) for k in range(4)]
    rids = [c.send("echo", tensors={"x": s}) for s in sent] + [c.send("ping", {"k": k}) for k in range(4)]
    replies = [c.wait(rid) for rid in reversed(rids)][::-1]
    assert [r.rid for r in replies] == rids
    for reply, want in zip(replies, sent):
        np.testing.assert_array_equal(reply.tensors["x"], want)
    assert [r.header["echo"] for r in replies] == ["echo"] * 4 + ["ping"] * 4
    assert wait_until(lambda: doorbell_ways(task, "echo")[0] >= 4, 10)


def test_a_request_waiting_on_zmq_keeps_the_next_ones_on_zmq(rung):
    task, c = rung
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
    task, c = rung
    rid = c.send("hold")  # the server never answers it
    assert wait_until(lambda: doorbell_ways(task, "hold") == (1, 0), 10)
    os.killpg(task.proc.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(PeerLostError, match="lost the connection"):
        c.wait(rid, timeout_s=15)
    assert time.monotonic() - started < 5, "a dead server must not cost the client its whole timeout"
    assert c.bell_state is None


def _doorbell_name(c) -> str:
    return c._bell.name  # (the address a process that lists /proc/net/unix would find)


def test_a_line_that_is_not_an_attached_client_is_hung_up_on(rung, tmp_path):
    task, c = rung
    name = _doorbell_name(c)
    lines = []
    try:
        wrong = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lines.append(wrong)
        wrong.connect(address_of(name))
        wrong.send(os.urandom(NONCE_BYTES))
        wrong.settimeout(10)
        assert wrong.recv(64) == b"", "a hello with a nonce of no area must be hung up on"
        # the right nonce, from a process that is not the area's: the kernel says who connects
        nonce = c._area.offer()["nonce"]
        other = subprocess.run([sys.executable, "-c", OTHER_PROCESS, name], input=nonce, capture_output=True,
                               timeout=30)
        assert other.stdout.strip() == b"hung up", other
        assert "refused a doorbell line of pid" in task.output()
        # lines that say nothing: at most MAX_UNBOUND are held, and none past HELLO_TIMEOUT_S
        for _ in range(MAX_UNBOUND + 4):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.setblocking(False)
            lines.append(s)
            try:
                s.connect(address_of(name))
            except BlockingIOError:  # the listen queue is full: not accepted
                pass
        silent = lines[1:]
        time.sleep(1.0)
        assert sum(not _hung_up(s) for s in silent) <= MAX_UNBOUND
        assert c.call("ping").header["echo"] == "ping" and c.bell_state is BellState.UP, "the client still rings"
        assert wait_until(lambda: all(_hung_up(s) for s in silent), HELLO_TIMEOUT_S + 3 * SWEEP_EVERY_S)
        assert c.call("ping").header["echo"] == "ping"
    finally:
        for s in lines:
            s.close()


def _hung_up(s: socket.socket) -> bool:
    try:
        return s.recv(64, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # never connected
        return True


OTHER_PROCESS = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(b"\\0" + sys.argv[1].encode())
s.send(sys.stdin.buffer.read())
s.settimeout(10)
print("hung up" if s.recv(64) == b"" else "answered", flush=True)
"""


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
