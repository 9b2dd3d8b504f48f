"""Bad peers are refused while the ps keeps serving; a dead ps is a clear error, not a hang."""

import os
import signal
import socket
import time

import msgpack
import psutil
import pytest

import shoal
from shoal.wire import PROTOCOL_VERSION, AuthRejectedError, JobSecret, RemoteError, RpcClient
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, status, variables


def wait_until_serving(cluster, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return status(cluster, timeout_s=1)
        except shoal.ShoalError:
            if time.monotonic() > deadline:
                raise


def test_garbage_bytes_and_malformed_messages_are_refused_and_ps_keeps_serving(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    wait_until_serving(cluster)
    host, port = cluster.spec["ps"][0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:  # not even zmq
        raw.sendall(os.urandom(4096))
    client = RpcClient(cluster.spec["ps"][0], secret_of(cluster), "ps:0", 5)
    client.connect()
    sock = client._sock
    for frames in ([b"\xc1garbage"], [msgpack.packb({"v": PROTOCOL_VERSION, "rid": 7, "op": "pull", "t": [["x", "float32", [4], 1]]})],
                   [msgpack.packb({"v": 99, "rid": 8, "op": "status", "t": []})],
                   [msgpack.packb({"v": PROTOCOL_VERSION, "rid": 9, "op": "launch_missiles", "t": []})]):
        sock.send_multipart(frames)
        assert sock.poll(5000), "the ps must answer a malformed message with an error"
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["ok"] is False and reply["error"]
    assert status(cluster).ready is False  # still serving
    client.close()


def test_a_request_whose_error_would_quote_a_megabyte_is_answered_in_short_and_the_ps_serves_on(make_cluster):
    """An error text quoting what the peer sent (a 300 KB chunk count; 95,000 unknown rule fields)
    once made a reply over the header limit: encoding it raised on the serving thread, the ps
    stopped serving and exited 0."""
    cluster = make_cluster(num_ps=1, num_workers=1)
    ps = start_ps(cluster)
    wait_until_serving(cluster)
    client = RpcClient(cluster.spec["ps"][0], secret_of(cluster), "ps:0", 5)
    client.connect()
    sock = client._sock
    bad_chunks = {"v": PROTOCOL_VERSION, "rid": 7, "op": "push", "task": "worker:0", "step": 0,
                  "t": [["x", "float32", [1], "\x00" * 300_000]]}
    bad_rule = {"v": PROTOCOL_VERSION, "rid": 8, "op": "init", "t": [], "mode": "async", "sync_replicas": None,
                "rule": {"name": "sgd", **{f"k{i:07d}": 0 for i in range(95_000)}}}
    for request in (bad_chunks, bad_rule):
        sock.send_multipart([msgpack.packb(request)])
        assert sock.poll(5000), "the ps must answer the request with an error"
        reply = msgpack.unpackb(sock.recv_multipart()[0])
        assert reply["ok"] is False and reply["rid"] == request["rid"]
        assert len(reply["error"]) < 3000, reply["error"][:300]
    assert status(cluster).ready is False  # still serving
    client.close()
    assert ps.proc.poll() is None
    log = ps.output()
    assert len(log) < 20_000, f"the ps logged {len(log)} characters for two bad requests"


def test_peer_with_wrong_secret_is_refused_and_others_still_served(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    wait_until_serving(cluster)
    intruder = RpcClient(cluster.spec["ps"][0], JobSecret(b"not-the-secret", "test"), "ps:0", 5)
    started = time.monotonic()
    with pytest.raises(AuthRejectedError, match="SHOAL_JOB_SECRET"):
        intruder.call("status")
    assert time.monotonic() - started < 4
    intruder.close()
    worker = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                   secret=secret_of(cluster), request_timeout_s=5).start()
    assert worker.push(grads()).global_step == 1
    worker.close()


def test_unknown_variable_is_refused_with_a_clear_error(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    worker = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                   secret=secret_of(cluster), request_timeout_s=5).start()
    with pytest.raises(RemoteError, match="holds no variable 'nope'"):
        worker.ps.pull_all([["nope"]], 0, {})
    worker.close()


def test_request_to_killed_ps_fails_after_the_recovery_timeout(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=1)
    ps = [start_ps(cluster, i) for i in range(2)]
    worker = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                   secret=secret_of(cluster), request_timeout_s=2, min_shard_bytes=8,
                                   ps_recovery_timeout_s=2, rehome_lost_ps=False).start()  # fail, not re-home
    worker.push(grads())
    os.killpg(ps[1].proc.pid, signal.SIGKILL)
    ps[1].wait(timeout=10)
    started = time.monotonic()
    with pytest.raises(shoal.TrainError, match=r"ps:1 at 127\.0\.0\.1:\d+ did not come back within 2s"):
        worker.push(grads())
    assert time.monotonic() - started < 6
    worker.close()


def test_hung_ps_fails_the_request_within_its_timeout(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=1)
    ps = [start_ps(cluster, i) for i in range(2)]
    worker = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                   secret=secret_of(cluster), request_timeout_s=2, min_shard_bytes=8).start()
    worker.push(grads())
    os.killpg(ps[1].proc.pid, signal.SIGSTOP)  # alive but silent: the connection stays up
    try:
        deadline = time.monotonic() + 5  # the signal takes effect when the kernel next schedules it
        while psutil.Process(ps[1].proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "ps:1 did not stop"
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(shoal.TrainError, match=r"ps:1 at 127\.0\.0\.1:\d+ did not answer 'push' within 2\.0s"):
            worker.push(grads())
        assert time.monotonic() - started < 4
    finally:
        os.killpg(ps[1].proc.pid, signal.SIGKILL)
    worker.close()
