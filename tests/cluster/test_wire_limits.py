"""What a peer without the job secret can cost a server: a small, fixed amount of memory and
file descriptors, however it behaves (issue 10: F2, W7). Real server processes, raw sockets."""

from __future__ import annotations

import resource
import socket
import time

import numpy as np
import psutil
import pytest

import shoal
from shoal.wire import CHUNK_BYTES, JobSecret, RpcClient
from shoal.wire.limits import ConnectionLimits
from tests.cluster.ps_process import PS_ONLY, config_for, grads, secret_of, variables
from tests.cluster.zmtp import HalfHandshakes, command_header, greeting, send_until_refused

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


# The ps program every cluster test runs, after setting its open-file limit from argv.
PS_WITH_NOFILE = ("import resource, sys; "
                  "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
                  + PS_ONLY[1])


def start_ps_with_nofile(cluster, soft: int, hard: int):
    """A real ps whose open-file limit was set as by `ulimit -n` before it started."""
    return cluster.start("ps", 0, ["-c", PS_WITH_NOFILE, str(soft), str(hard)])


def ps_status(cluster, timeout_s: float) -> dict:
    client = RpcClient(cluster.spec["ps"][0], JobSecret(cluster.secret.encode(), "test"), "ps:0", timeout_s)
    try:
        return client.call("status").header
    finally:
        client.close()


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)


def test_open_file_soft_limit_is_raised_to_the_hard_limit(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    task = start_ps_with_nofile(cluster, 512, 2048)
    ps_status(cluster, 30)
    assert psutil.Process(task.proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (2048, 2048)


def _raise_own_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"this test holds {need} sockets; the open-file hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


@pytest.mark.parametrize("source, reopen", [("127.0.0.2", True), ("127.0.0.1", False)],
                         ids=["other-address-reopening", "same-address-idle"])
def test_worker_gets_through_1100_half_handshakes_at_1024_open_files(make_cluster, source, reopen):
    """W7: a ps limited to 1024 open files, 1100 connections that greet and go silent (from
    another address, reopened as the ps drops them; or idle, from the worker's own address):
    a restarted worker must still connect, initialize and train, well before the ps's handshake
    timeout (10 s) would have freed the descriptors the silent connections hold."""
    _raise_own_nofile(1100 + 200)
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps_with_nofile(cluster, 1024, 1024)
    ps_status(cluster, 30)
    attack = HalfHandshakes(host_port(cluster), 1100, source, reopen=reopen).start()
    try:
        wait_for(lambda: attack.greeted >= 1100, 30, "1100 half-handshakes to reach the ps")
        sweeps = attack.sweeps
        wait_for(lambda: attack.sweeps >= sweeps + 2, 30, "the ps to accept what it can of them")
        session = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                        secret=secret_of(cluster), request_timeout_s=5, init_timeout_s=5).start()
        try:
            assert session.push(grads()).global_step == 1
        finally:
            session.close()
    finally:
        attack.stop()


def test_unauthenticated_frames_from_one_address_cost_at_most_its_bound(make_cluster):
    """F2 within the frame limit: 32 silent connections from one address, then each that the
    server still holds sends a frame of almost the largest size. Only the per-address bound of
    them may hold a buffer."""
    cluster = make_cluster(num_ps=1, num_workers=0)
    task = start_echo(cluster)
    assert echo_works(cluster)
    server = psutil.Process(task.proc.pid)
    before = server.memory_info().rss
    attack = HalfHandshakes(host_port(cluster), 32, "127.0.0.2", reopen=False).start()
    survivors = []
    try:
        bound = ConnectionLimits().unauthenticated_per_address
        wait_for(lambda: attack.sweeps >= 2 and attack.open_count() <= bound, 10,
                 f"the server to drop all but {bound} connections")
        survivors = attack.take_open()
        for sock in survivors:
            sock.setblocking(True)
            sock.settimeout(5)
            sock.sendall(command_header(CHUNK_BYTES))
            send_until_refused(sock, CHUNK_BYTES - 1)
        growth = server.memory_info().rss - before
    finally:
        attack.stop()
        for sock in survivors:
            sock.close()
    assert growth < (bound + 2) * CHUNK_BYTES, f"grew by {growth / MiB:.0f} MiB"
    assert echo_works(cluster)
