"""The replicator's sending thread against a real, silent successor: a TCP listener that
accepts and never speaks (a ps that hangs, or one already gone while its port is held)."""

import logging
import socket
import threading
import time

import numpy as np
import pytest

from shoal.ps.protocol import ASYNC, ReplicateRequest
from shoal.ps.optimizers import SGD
from shoal.ps.replicator import ReplicationOptions, Replicator
from shoal.wire import JobSecret

SEND_TIMEOUT_S = 60.0


@pytest.fixture
def silent_successor():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


def replicator(address: str) -> Replicator:
    return Replicator(0, 1, address, JobSecret(b"s" * 32, "test"),
                      ReplicationOptions(every_steps=1, timeout_s=SEND_TIMEOUT_S)).start()


def offer(rep: Replicator, step: int, tensors) -> None:
    rep.offer(ReplicateRequest(0, "a" * 16, step, ASYNC, SGD(1.0).to_config()), tensors, copy_ms=0.0)


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_close_abandons_a_send_in_flight_instead_of_holding_the_ps_for_its_timeout(silent_successor):
    rep = replicator(silent_successor)
    offer(rep, 1, {"w": np.zeros(1 << 16, np.float32)})
    wait_until(lambda: not rep.due(2) and rep._pending is None)  # taken by the thread: in flight
    started = time.monotonic()
    rep.close()
    assert time.monotonic() - started < SEND_TIMEOUT_S / 2  # not the send's 60 s timeout
    assert not rep._thread.is_alive()
    rep.close()  # idempotent


def test_an_unexpected_error_in_a_send_is_logged_and_replication_goes_on(silent_successor, caplog):
    rep = replicator(silent_successor)
    try:
        with caplog.at_level(logging.ERROR, logger="shoal.ps.replicator"):
            offer(rep, 1, {"w": "not an array"})  # fails while encoding: no wire error
            wait_until(lambda: rep.due(2))  # the failed send no longer counts as in flight
        assert "could not replicate step 1 to ps:1" in caplog.text
        assert rep._thread.is_alive()
        offer(rep, 2, {"w": np.zeros(4, np.float32)})
        wait_until(lambda: rep._pending is None)  # the thread took the next replica
    finally:
        rep.close()
