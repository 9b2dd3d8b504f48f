"""`wait_all` over several connections: the replies come back to the requests that asked, call
after call, also after a connection was dropped and made again (the poller of a group of
connections is kept between waits while its sockets are the same). Real echo server processes."""

from __future__ import annotations

import numpy as np

from shoal.wire import JobSecret, RpcClient, Security, wait_all

ECHO = "tests/cluster/programs/wire_echo.py"


def echo_servers(cluster) -> list[RpcClient]:
    clients = []
    for index, address in enumerate(cluster.spec["ps"]):
        task = cluster.start("ps", index, [ECHO, address, "--security", Security.PLAIN.value])
        task.wait_for_output("serving", 30)
        clients.append(RpcClient(address, JobSecret(cluster.secret.encode(), "test"), f"echo:{index}", 20,
                                 security=Security.PLAIN))
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
