"""A replica that leaves training by an error is not done: the ps tasks keep serving it, so a
restarted chief carries on (issue F1), and the job still ends when every replica failed."""

import time

import pytest

import shoal
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, status, variables


def session(cluster, job, index):
    return shoal.TrainingSession(config_for(cluster, job, index), variables(), shoal.SGD(0.1),
                                 secret=secret_of(cluster), request_timeout_s=10, init_timeout_s=30)


def test_chief_leaving_by_an_exception_is_not_counted_done_and_its_restart_finishes_the_job(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2)
    ps = start_ps(cluster)
    with pytest.raises(KeyboardInterrupt):
        with session(cluster, "worker", 0) as chief:
            chief.push(grads())
            raise KeyboardInterrupt  # Ctrl-C in the chief, mid-training
    with session(cluster, "worker", 1) as worker:
        worker.push(grads())
    time.sleep(1.0)  # time enough for the ps to stop, if it (wrongly) thought the job was over
    assert ps.proc.poll() is None and status(cluster).done == ("worker:1",)
    with session(cluster, "worker", 0) as restarted:  # the launcher's restart of the chief
        assert restarted.global_step == 2 and status(cluster).created == 2  # not initialized again
        restarted.push(grads())
    assert ps.wait(timeout=10) == 0


def test_ps_exits_when_every_replica_failed(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2)
    ps = start_ps(cluster)
    for index in (0, 1):
        with pytest.raises(RuntimeError):
            with session(cluster, "worker", index) as replica:
                replica.push(grads())
                raise RuntimeError("a bug in the training loop")
    assert ps.wait(timeout=10) == 0
