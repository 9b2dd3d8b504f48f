"""Encryption and authentication between hosts (issue 11, item 4): CURVE with keys derived from
the job secret. Real server processes; a relay of our own plays the network between two hosts."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from shoal.wire import CHUNK_BYTES, AuthRejectedError, JobSecret, RpcClient, Security
from tests.cluster.relay import Relay

ECHO = "tests/cluster/programs/wire_echo.py"
# A tensor nobody could mistake: a phrase repeated, so a reader that sees it in clear finds it.
PATTERN = b"shoal-tensor-bytes-in-clear!"


def start_echo(cluster, security: Security):
    task = cluster.start("ps", 0, [ECHO, cluster.spec["ps"][0], "--security", security.value])
    task.wait_for_output("serving", 30)
    return task


def client(address: str, secret: str | bytes, security: Security, timeout_s: float = 20) -> RpcClient:
    value = secret if isinstance(secret, bytes) else secret.encode()
    return RpcClient(address, JobSecret(value, "test"), "echo", timeout_s, security=security)


def handled(task) -> int:
    return task.output().count("handled ")


def target(cluster) -> tuple[str, int]:
    host, port = cluster.spec["ps"][0].rsplit(":", 1)
    return host, int(port)


def patterned(nbytes: int) -> np.ndarray:
    return np.frombuffer((PATTERN * (nbytes // len(PATTERN) + 1))[:nbytes], dtype=np.uint8).copy()


def test_curve_server_and_client_exchange_tensors_exactly(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    start_echo(cluster, Security.CURVE)
    c = client(cluster.spec["ps"][0], cluster.secret, Security.CURVE)
    try:
        assert c.security is Security.CURVE
        tensors = {"big": np.random.default_rng(0).random(CHUNK_BYTES // 8 * 2 + 3),  # three chunks
                   "small": np.arange(6, dtype=np.int32).reshape(2, 3)}
        reply = c.call("echo", tensors=tensors)
        for name, value in tensors.items():
            np.testing.assert_array_equal(reply.tensors[name], value)
    finally:
        c.close()


def test_client_with_wrong_secret_is_refused_by_curve_server(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task = start_echo(cluster, Security.CURVE)
    intruder = client(cluster.spec["ps"][0], "not-the-secret", Security.CURVE, timeout_s=15)
    try:
        with pytest.raises(AuthRejectedError, match="different job secrets"):
            intruder.call("echo")
    finally:
        intruder.close()
    good = client(cluster.spec["ps"][0], cluster.secret, Security.CURVE)
    try:
        good.call("after")
    finally:
        good.close()
    assert handled(task) == 1 and "handled after" in task.output()


def test_plain_client_is_refused_by_curve_server_as_a_mismatch(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    task = start_echo(cluster, Security.CURVE)
    plain = client(cluster.spec["ps"][0], cluster.secret, Security.PLAIN, timeout_s=15)
    try:
        with pytest.raises(AuthRejectedError, match="different security settings"):
            plain.call("echo")
    finally:
        plain.close()
    assert handled(task) == 0


@pytest.mark.parametrize("security", [Security.PLAIN, Security.CURVE])
def test_passive_reader_sees_tensor_bytes_only_without_curve(make_cluster, security):
    cluster = make_cluster(num_ps=1, num_workers=0)
    start_echo(cluster, security)
    relay = Relay(target(cluster))
    c = client(relay.address, cluster.secret, security)
    try:
        value = patterned(CHUNK_BYTES + 4096)  # a full chunk and a small one, both ways
        np.testing.assert_array_equal(c.call("echo", tensors={"x": value}).tensors["x"], value)
    finally:
        c.close()
        relay.stop()
    recorded = relay.recorded()
    assert len(recorded) > 2 * value.nbytes  # the reader saw the whole exchange
    if security is Security.CURVE:
        assert PATTERN not in recorded
    else:  # the control: without encryption the reader sees the tensor
        assert recorded.count(PATTERN) >= 2 * (value.nbytes // len(PATTERN)) - 4


@pytest.mark.parametrize("security", [Security.PLAIN, Security.CURVE])
def test_replayed_client_bytes_deliver_a_request_only_without_curve(make_cluster, security):
    """Record a client's whole conversation (handshake and one request), then play the client's
    bytes to the server again from a new connection, turn by turn as the client sent them."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    task = start_echo(cluster, security)
    relay = Relay(target(cluster))
    c = client(relay.address, cluster.secret, security)
    try:
        c.call("echo", tensors={"x": patterned(4096)})
    finally:
        c.close()
        relay.stop()
    assert handled(task) == 1
    recorded = relay.conversations[0]
    with socket.create_connection(target(cluster), timeout=10) as replay:
        recorded.replay(replay)
        if security is Security.PLAIN:  # the control: a replayed PLAIN session is a valid one
            deadline = time.monotonic() + 20
            while handled(task) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert handled(task) == 2
            return
        while replay.recv(65536):  # the server hangs up on the replayed handshake
            pass
    assert handled(task) == 1


def test_seed_example_trains_with_curve_forced_on_loopback_by_its_flag(make_cluster):
    # On loopback AUTO means PLAIN; a side that ignored --wire_security curve would be refused
    # by the other (a mismatch), so a finished job shows both sides took the flag.
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "200", "--wire_security", "curve"])
    codes = cluster.wait_all(timeout=120)
    assert codes == {"ps:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    assert "serving at 127.0.0.1" in cluster.tasks[0].output() and "(CURVE;" in cluster.tasks[0].output()
    assert all("accuracy: " in w.output() for w in cluster.tasks[1:])
