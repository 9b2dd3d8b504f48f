"""What a peer without the job secret can cost a server: a small, fixed amount of memory and
file descriptors, however it behaves (issue 10: F2, W7). Real server processes, raw sockets."""

from __future__ import annotations

import socket

import numpy as np
import psutil

from shoal.wire import CHUNK_BYTES, JobSecret, RpcClient
from tests.cluster.zmtp import command_header, greeting, send_until_refused

MiB = 1 << 20
ECHO = "tests/cluster/programs/wire_echo.py"


def start_echo(cluster, *args: str):
    task = cluster.start("ps", 0, [ECHO, cluster.spec["ps"][0], *args])
    task.wait_for_output("serving", 30)
    return task


def host_port(cluster) -> tuple[str, int]:
    host, port = cluster.spec["ps"][0].rsplit(":", 1)
    return host, int(port)


def echo_works(cluster, timeout_s: float = 20, nbytes: int = 4000) -> bool:
    client = RpcClient(cluster.spec["ps"][0], JobSecret(cluster.secret.encode(), "test"), "echo", timeout_s)
    try:
        x = np.arange(nbytes // 4, dtype=np.float32)
        reply = client.call("echo", tensors={"x": x})
        return reply.header["echo"] == "echo" and np.array_equal(reply.tensors["x"], x)
    finally:
        client.close()


def test_frame_declared_huge_before_auth_costs_no_memory(make_cluster):
    """F2: four connections greet for PLAIN, declare a 1 GiB command frame and stream 64 MiB of
    it. zmq used to buffer all of it before checking the password."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    task = start_echo(cluster)
    assert echo_works(cluster)  # warm: the server's own buffers are allocated
    server = psutil.Process(task.proc.pid)
    before = server.memory_info().rss
    socks = []
    try:
        for _ in range(4):
            sock = socket.create_connection(host_port(cluster), timeout=5)
            socks.append(sock)
            sock.sendall(greeting(b"PLAIN") + command_header(1 << 30))
            send_until_refused(sock, 64 * MiB)
        growth = server.memory_info().rss - before
    finally:
        for sock in socks:
            sock.close()
    assert growth < 32 * MiB, f"the server grew by {growth / MiB:.0f} MiB for peers that never authenticated"
    assert echo_works(cluster)


def test_largest_frames_shoal_sends_pass_the_frame_limit(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=0)
    start_echo(cluster)
    assert echo_works(cluster, nbytes=2 * CHUNK_BYTES + 4)  # two full chunks and a small one, both ways
