"""`wait_all` over several connections: the replies come back to the requests that asked, call
after call, also after a connection was dropped and made again; a connection lost while the
wait blocks on another one is reported at once, not at the timeout; a refusal by one server
leaves the other servers' replies for the next wait; a server restarted while nothing was out
answers the next request (the old connection's end is not taken for that request's loss), and
one that died then fails the next request at once; and a request zmq has no room for fails after
the client's timeout instead of blocking. Real echo server processes (and a silent listener)."""

from __future__ import annotations

import os
import signal
import socket
import time

import numpy as np
import pytest

from shoal.wire import JobSecret, PeerLostError, PeerTimeoutError, RemoteError, RpcClient, Security, wait_all

ECHO = "tests/cluster/programs/wire_echo.py"


def echo_servers(cluster, shared_memory: bool = True) -> list[RpcClient]:
    clients = []
    for index, address in enumerate(cluster.spec["ps"]):
        task = cluster.start("ps", index, [ECHO, address, "--security", Security.PLAIN.value])
        task.wait_for_output("serving", 30)
        clients.append(RpcClient(address, JobSecret(cluster.secret.encode(), "test"), f"echo:{index}", 20,
                                 security=Security.PLAIN, shared_memory=shared_memory))
    return clients


def ask(clients: list[RpcClient], round_: int) -> None:
    """One request to each client, awaited together; each reply must carry its own request's tensor."""
    sent = {c.peer_name: np.full(3, round_ * 10 + k, np.int64) for k, c in enumerate(clients)}
    rids = [(c, c.send("echo", tensors={"x": sent[c.peer_name]})) for c in clients]
    for (c, _), reply in zip(rids, wait_all(rids, 20)):
        np.testing.assert_array_equal(reply.tensors["x"], sent[c.peer_name])


def test_wait_all_answers_each_request_over_repeated_waits_and_reconnects(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=0)
    a, b = echo_servers(cluster)
    try:
        for round_ in range(5):
            ask([a, b], round_)
        ask([b, a], 5)  # the same connections, in the other order
        a.reset()  # a dropped connection: the next request makes a new socket
        for round_ in range(6, 9):
            ask([a, b], round_)
        ask([a], 9)
        ask([a, b], 10)
    finally:
        a.close()
        b.close()


def test_a_connection_lost_while_the_wait_blocks_on_another_is_reported_at_once(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=0)  # its fixture SIGKILLs both servers' groups afterwards
    a, b = echo_servers(cluster)
    try:
        ask([a, b], 0)  # both connections are up
        os.killpg(cluster.tasks[0].proc.pid, signal.SIGSTOP)  # a: alive but silent, the wait blocks on it first
        rids = [(a, a.send("echo", tensors={"x": np.zeros(3)})), (b, b.send("echo", tensors={"x": np.zeros(3)}))]
        os.killpg(cluster.tasks[1].proc.pid, signal.SIGKILL)  # b: gone, with a request out
        started = time.monotonic()
        with pytest.raises(PeerLostError, match=r"lost the connection to echo:1 at 127\.0\.0\.1:\d+ while it handled 'echo'"):
            wait_all(rids, 20)
        assert time.monotonic() - started < 5, "the lost connection was noticed only near the timeout"
    finally:
        a.close()
        b.close()


def test_a_refusal_by_one_server_leaves_the_other_replies_for_the_next_wait(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=0)
    a, b = echo_servers(cluster)
    try:
        sent = np.arange(4, dtype=np.int64)
        rids = [(a, a.send("echo", tensors={"x": sent})), (b, b.send("refuse"))]
        with pytest.raises(RemoteError, match=r"echo:1 at 127\.0\.0\.1:\d+ refused 'refuse': refused as asked"):
            wait_all(rids, 20)
        (reply,) = wait_all(rids[:1], 2)  # the caller recovers the refusing server and waits again for the rest
        np.testing.assert_array_equal(reply.tensors["x"], sent)
        ask([a, b], 1)  # both connections still serve
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)  # the old send blocked for ever here
def test_a_request_zmq_has_no_room_for_fails_after_the_clients_timeout_instead_of_blocking():
    with socket.socket() as silent:  # accepts connections (the kernel does) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        c = RpcClient(f"127.0.0.1:{silent.getsockname()[1]}", JobSecret(b"a-job-secret", "test"), "echo:0", 1.0,
                      security=Security.PLAIN)
        try:
            queued = 0
            with pytest.raises(PeerTimeoutError, match="no room to queue 'status'"):
                while queued < 10_000:
                    started = time.monotonic()
                    c.send("status")  # queued by zmq, up to its send high-water mark
                    queued += 1
            waited = time.monotonic() - started
            assert 100 <= queued < 10_000 and 0.9 <= waited < 10, (queued, waited)
            c.send("status")  # reset: the next request queues on a new connection at once
        finally:
            c.close()


@pytest.mark.parametrize("shared_memory", [False, True], ids=["zmq", "doorbell"])
def test_a_server_restarted_between_requests_answers_the_next_one_and_nothing_is_called_lost(make_cluster,
                                                                                            shared_memory):
    """The old connection's DISCONNECTED event, read only after the next request was queued on
    the new one, was taken for that request's connection going down (PeerLostError)."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    (client,) = echo_servers(cluster, shared_memory)
    try:
        ask([client], 0)
        os.killpg(cluster.tasks[0].proc.pid, signal.SIGKILL)  # nothing out: no request can be lost
        cluster.tasks[0].proc.wait(10)
        cluster.start("ps", 0, [ECHO, client.address, "--security", Security.PLAIN.value]).wait_for_output(
            "serving", 30)
        time.sleep(1.0)  # zmq has seen the old connection go (the event waits unread) and made a new one
        client.call("slow", timeout_s=10)  # answered after 0.3 s: the wait reads the monitor meanwhile
        for round_ in range(1, 4):
            ask([client], round_)
    finally:
        client.close()


@pytest.mark.parametrize("shared_memory", [False, True], ids=["zmq", "doorbell"])
def test_a_server_that_died_between_requests_fails_the_next_one_at_once_not_at_the_timeout(make_cluster,
                                                                                          shared_memory):
    cluster = make_cluster(num_ps=1, num_workers=0)
    (client,) = echo_servers(cluster, shared_memory)  # a 20 s request timeout
    try:
        ask([client], 0)
        os.killpg(cluster.tasks[0].proc.pid, signal.SIGKILL)  # nothing out; it does not come back
        cluster.tasks[0].proc.wait(10)
        time.sleep(1.0)  # zmq has seen the connection go (the event waits unread)
        started = time.monotonic()
        with pytest.raises(PeerLostError,
                           match=r"lost the connection to echo:0 at 127\.0\.0\.1:\d+ while it handled 'echo'"):
            ask([client], 1)
        assert time.monotonic() - started < 5, "the server's end was noticed only at the timeout"
    finally:
        client.close()


def test_a_request_dropped_when_another_one_failed_is_reported_lost_at_once_not_at_the_timeout(make_cluster):
    """Two requests out on one connection (an overlapped push, then a lease): the server goes,
    the wait for the second fails and resets the connection, and the server comes back. A wait
    for the first, whose reply can never come now, raises PeerLostError at once (so the ps
    client recovers and resends it), not PeerTimeoutError after the request timeout."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    (client,) = echo_servers(cluster)  # a 20 s request timeout
    try:
        ask([client], 0)
        os.killpg(cluster.tasks[0].proc.pid, signal.SIGSTOP)  # alive but silent: the first stays unanswered
        first = client.send("echo", tensors={"x": np.zeros(3)})
        second = client.send("echo", tensors={"x": np.ones(3)})
        os.killpg(cluster.tasks[0].proc.pid, signal.SIGKILL)
        cluster.tasks[0].proc.wait(10)
        with pytest.raises(PeerLostError):
            client.wait(second)
        cluster.start("ps", 0, [ECHO, client.address, "--security", Security.PLAIN.value]).wait_for_output(
            "serving", 30)
        ask([client], 1)  # the new connection serves
        started = time.monotonic()
        with pytest.raises(PeerLostError, match=r"while it handled 'echo': it was reset when another request failed"):
            client.wait(first)
        assert time.monotonic() - started < 2
    finally:
        client.close()
