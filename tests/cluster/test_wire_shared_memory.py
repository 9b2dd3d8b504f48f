"""Shared-memory areas between a client and a server process on this machine
(shoal/wire/shared_area.py): once the server attached a client's area, tensors and their replies
travel through it, requests in flight each in a block of their own, and what does not fit goes
through the socket; an error reply hands the block back; a server started again on the same
address attaches the area from the next request; a server that refuses, or an offer that is not
the client's own area, leaves everything on the socket, as does a client whose server is on
another host; the server lets go of an area once its client reset or died; a worker with shared
memory off says so. Real echo server processes; what the server maps is read from its
/proc/<pid>/maps."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

from shoal.wire import JobSecret, RemoteError, RpcClient, Security
from shoal.wire.shared_area import (AREA_BYTES, BLOCK_KEY, MEMFD_NAME, NONCE_BYTES, OFFER_KEY, AreaState, SharedArea,
                                    seals)
from shoal.wire.shared_attach import SWEEP_EVERY_S
from tests.cluster.harness import drain_disconnect_while_idle

ECHO = "tests/cluster/programs/wire_echo.py"
BIG = 100_000  # float32s: 400 KB, well above MIN_SHARED_BYTES


def echo_server(cluster, *args: str):
    address = cluster.spec["ps"][0]
    task = cluster.start("ps", 0, [ECHO, address, "--security", Security.PLAIN.value, *args])
    task.wait_for_output("serving", 30)
    return task, address


def client(cluster, address: str, **kwargs) -> RpcClient:
    return RpcClient(address, JobSecret(cluster.secret.encode(), "test"), "echo:0", 20, security=Security.PLAIN,
                     **kwargs)


def mapped_areas(pid: int) -> int:
    """How many shared areas process `pid` maps."""
    with open(f"/proc/{pid}/maps") as maps:
        return sum(f"/memfd:{MEMFD_NAME}" in line for line in maps)


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_tensors_and_their_replies_travel_through_the_area_once_the_server_attached_it(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address)
    try:
        x = np.arange(BIG, dtype=np.float32)
        first = c.call("echo", tensors={"x": x, "b": np.ones(3)})
        assert BLOCK_KEY not in first.header, "the offering request itself goes through the socket"
        assert c.shared_state is AreaState.ATTACHED
        for k in range(3):
            reply = c.call("echo", tensors={"x": x + k, "b": np.full(3, k)})
            assert BLOCK_KEY in reply.header, "the reply must come back through the area"
            np.testing.assert_array_equal(reply.tensors["x"], x + k)
            np.testing.assert_array_equal(reply.tensors["b"], np.full(3, k))
        assert mapped_areas(task.proc.pid) == 1
    finally:
        c.close()


def test_a_client_whose_server_is_not_on_this_host_never_offers_its_area(make_cluster, monkeypatch):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    asked = []

    def elsewhere(addr: str) -> bool:  # as is_on_this_host answers for another host's address
        asked.append(addr)
        return False
    monkeypatch.setattr("shoal.wire.client.is_on_this_host", elsewhere)
    c = client(cluster, address)
    try:
        assert c.shared_state is AreaState.NONE and asked == [], "created without asking (no name lookup)"
        c.call("ping")  # no tensors: still no need to ask
        assert asked == []
        c.call("echo", tensors={"b": np.ones(3)})  # the first request with tensors asks, once
        assert asked == [address]
        for _ in range(2):
            reply = c.call("echo", tensors={"x": np.arange(BIG, dtype=np.float32)})
            assert BLOCK_KEY not in reply.header and reply.tensors["x"][-1] == BIG - 1
        assert asked == [address] and c.shared_state is None
        assert mapped_areas(task.proc.pid) == 0 and mapped_areas(os.getpid()) == 0
    finally:
        c.close()


@dataclass
class Attached:
    cluster: object
    server: object  # the echo server's task
    client: RpcClient


@pytest.fixture
def attached(make_cluster):
    """A client whose area an echo server has attached (closed afterwards)."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address)
    try:
        c.call("echo", tensors={"x": np.zeros(BIG, np.float32)})
        assert c.shared_state is AreaState.ATTACHED
        yield Attached(cluster, task, c)
    finally:
        c.close()


def test_requests_in_flight_have_their_own_blocks_and_what_does_not_fit_goes_through_the_socket(attached):
    c = attached.client
    third = AREA_BYTES // 3 // 4  # three of these do not fit into one area
    sent = [np.full(third, k, np.float32) for k in range(3)]
    rids = [c.send("echo", tensors={"x": s}) for s in sent]
    replies = [c.wait(rid) for rid in rids]
    assert [BLOCK_KEY in r.header for r in replies] == [True, True, False]
    for reply, want in zip(replies, sent):
        np.testing.assert_array_equal(reply.tensors["x"], want)
    again = c.call("echo", tensors={"x": sent[2]})  # the blocks were handed back
    assert BLOCK_KEY in again.header


def test_an_error_reply_hands_the_block_back_and_a_reply_too_big_for_it_comes_as_frames(attached):
    c = attached.client
    third = np.ones(AREA_BYTES // 3 // 4, np.float32)
    for _ in range(3):  # had the refused requests kept their blocks, the area would be full after these
        with pytest.raises(RemoteError, match="refused as asked"):
            c.call("refuse", tensors={"x": third})
    assert BLOCK_KEY in c.call("echo", tensors={"x": third}).header
    x = np.arange(BIG, dtype=np.float32)
    grown = c.call("grow", tensors={"x": x})
    assert BLOCK_KEY not in grown.header
    np.testing.assert_array_equal(grown.tensors["x"], np.concatenate([x, x]))
    assert BLOCK_KEY in c.call("echo", tensors={"x": x}).header


def test_a_server_started_again_on_the_address_attaches_the_area_from_the_next_request(attached):
    c, x = attached.client, np.arange(BIG, dtype=np.float32)
    assert BLOCK_KEY in c.call("echo", tensors={"x": x}).header
    os.killpg(attached.server.proc.pid, signal.SIGKILL)  # no request waits: the client never hears of it ...
    attached.server.proc.wait(10)
    drain_disconnect_while_idle(c)
    again, _ = echo_server(attached.cluster)  # ... and zmq connects to the new one by itself
    for k in range(3):
        reply = c.call("echo", tensors={"x": x + k})
        assert BLOCK_KEY in reply.header, "the new server must attach the area the request names"
        np.testing.assert_array_equal(reply.tensors["x"], x + k)
    assert mapped_areas(again.proc.pid) == 1


def test_a_server_started_again_that_cannot_attach_the_area_sends_the_client_back_to_the_socket(attached):
    c, x = attached.client, np.arange(BIG, dtype=np.float32)
    os.killpg(attached.server.proc.pid, signal.SIGKILL)
    attached.server.proc.wait(10)
    drain_disconnect_while_idle(c)
    again, _ = echo_server(attached.cluster, "--no-shared-memory")
    with pytest.raises(RemoteError, match="could not be attached; its next requests go through the socket"):
        c.call("echo", tensors={"x": x})  # its tensors are in the area, which this server does not map
    assert c.shared_state is AreaState.REFUSED
    assert c.bell_state is None, "no doorbell without an attached area"
    for k in range(2):
        reply = c.call("echo", tensors={"x": x + k})
        assert BLOCK_KEY not in reply.header
        np.testing.assert_array_equal(reply.tensors["x"], x + k)
    assert "malformed" not in again.output()


def test_a_request_whose_area_its_client_closed_before_the_server_read_it_is_answered_not_called_malformed(
        make_cluster, tmp_path):
    # As a client that gave up on a request (it reset: a restarted ps looked lost) closes its area
    # while zmq still delivers the request to the new server, which has not attached that area.
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address, shared_memory=False)
    offer, fd = offer_of("own", tmp_path)
    os.close(fd)
    try:
        with pytest.raises(RemoteError, match="could not be attached"):
            c.call("echo", {OFFER_KEY: offer, BLOCK_KEY: [4096, 4096], "t": []})
        assert c.call("echo", tensors={"x": np.ones(4)}).tensors["x"].tolist() == [1, 1, 1, 1]
        output = task.output()
        assert "through the socket, not shared memory" in output
        assert "malformed" not in output
    finally:
        c.close()


def test_a_server_that_refuses_shared_memory_gets_the_tensors_through_the_socket(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster, "--no-shared-memory")
    c = client(cluster, address)
    try:
        x = np.arange(BIG, dtype=np.float32)
        for _ in range(3):
            reply = c.call("echo", tensors={"x": x})
            assert BLOCK_KEY not in reply.header
            np.testing.assert_array_equal(reply.tensors["x"], x)
        assert c.shared_state is AreaState.REFUSED
        assert mapped_areas(task.proc.pid) == 0
    finally:
        c.close()


def offer_of(kind: str, tmp_path) -> tuple[dict, int]:
    """An offer that is not a client's own sealed area, wrong in one way only, and the fd to
    close afterwards."""
    nonce = os.urandom(NONCE_BYTES)
    if kind == "regular file":
        path = tmp_path / "area"
        with open(path, "wb") as f:
            f.truncate(AREA_BYTES)
        fd = os.open(path, os.O_RDWR)
        os.pwrite(fd, nonce, 0)
        return {"pid": os.getpid(), "fd": fd, "size": AREA_BYTES, "nonce": nonce}, fd
    if kind in ("unsealed", "another name"):
        fd = os.memfd_create(MEMFD_NAME if kind == "unsealed" else "not-shoal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, AREA_BYTES)
        if kind == "another name":
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals())
        os.pwrite(fd, nonce, 0)
        return {"pid": os.getpid(), "fd": fd, "size": AREA_BYTES, "nonce": nonce}, fd
    area = SharedArea()
    area.open()
    offer = dict(area.offer())
    fd = os.dup(offer["fd"])
    area.close()  # (the dup keeps the memfd and its nonce)
    if kind == "wrong nonce":
        offer["nonce"] = bytes(NONCE_BYTES)
    elif kind == "wrong size":
        offer["size"] = AREA_BYTES // 2
    elif kind == "another process":
        offer["pid"] = 1
    offer["fd"] = fd
    return offer, fd


@pytest.mark.parametrize("kind", ["wrong nonce", "wrong size", "regular file", "unsealed", "another name",
                                  "another process"])
def test_an_offer_that_is_not_the_clients_own_sealed_area_is_refused(make_cluster, tmp_path, kind):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address, shared_memory=False)  # offers nothing itself: the test's offer is the only one
    offer, fd = offer_of(kind, tmp_path)
    try:
        reply = c.call("echo", {OFFER_KEY: offer}, {"x": np.ones(4)})
        assert reply.header.get("shm_ok") is False
        np.testing.assert_array_equal(reply.tensors["x"], np.ones(4))  # and it goes on serving
        assert mapped_areas(task.proc.pid) == 0
        assert "through the socket, not shared memory" in task.output()
    finally:
        c.close()
        os.close(fd)


def test_the_server_lets_go_of_the_area_of_a_client_that_reset_or_died(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task, address = echo_server(cluster)
    c = client(cluster, address)
    child = None
    try:
        c.call("echo", tensors={"x": np.zeros(BIG, np.float32)})
        assert mapped_areas(task.proc.pid) == 1
        c.reset()  # a new connection offers a new area; the old one is let go of
        c.call("echo", tensors={"x": np.zeros(BIG, np.float32)})
        assert c.shared_state is AreaState.ATTACHED
        assert wait_until(lambda: mapped_areas(task.proc.pid) == 1, SWEEP_EVERY_S * 3)
        child = subprocess.Popen([sys.executable, "-c", CHILD, address], env={**os.environ,
                                 "SHOAL_JOB_SECRET": cluster.secret}, stdout=subprocess.PIPE, text=True)
        assert select.select([child.stdout], [], [], 30)[0], "the child client said nothing within 30 s"
        assert child.stdout.readline().strip() == "attached"
        assert mapped_areas(task.proc.pid) == 2
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert wait_until(lambda: mapped_areas(task.proc.pid) == 1, SWEEP_EVERY_S * 3), \
            "the area of a client that died must be let go of"
    finally:
        c.close()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)


CHILD = """
import os, sys, time
import numpy as np
from shoal.wire import JobSecret, RpcClient, Security
c = RpcClient(sys.argv[1], JobSecret(os.environ["SHOAL_JOB_SECRET"].encode(), "test"), "echo:0", 20,
              security=Security.PLAIN)
c.call("echo", tensors={"x": np.zeros(100_000, np.float32)})
c.call("echo", tensors={"x": np.zeros(100_000, np.float32)})
print("attached" if c.shared_state.value == "attached" else c.shared_state, flush=True)
time.sleep(60)
"""


def test_seals_keep_an_attached_area_from_shrinking():
    area = SharedArea(nbytes=1 << 20)
    area.open()
    try:
        fd = area.offer()["fd"]
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals() == seals()
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)  # a server that maps it can never fault on a page taken away
    finally:
        area.close()


@pytest.mark.parametrize("flag", ["auto", "off"])
def test_the_worker_log_says_when_its_tensors_go_through_the_socket_because_shared_memory_is_off(make_cluster, flag):
    cluster = make_cluster(num_ps=1, num_workers=1)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "20", "--log_every", "10",
                       "--wire_shared_memory", flag])
    assert cluster.wait_all(timeout=120) == {"ps:0": 0, "worker:0": 0}, cluster.dump()
    ps, worker = cluster.tasks
    note = "tensors to ps:0 on this machine go through the socket (--wire_shared_memory off)"
    assert (note in worker.output()) == (flag == "off"), worker.output()[-3000:]
    assert ("sends its tensors through shared memory" in ps.output()) == (flag == "auto"), ps.output()[-3000:]
