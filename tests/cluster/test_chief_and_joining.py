"""The chief initializes once; non-chiefs wait for it; late workers join; ps tasks exit by themselves."""

import threading

import numpy as np

import shoal
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, status, variables


def session(cluster, job, index, **kw):
    return shoal.TrainingSession(config_for(cluster, job, index), variables(), shoal.SGD(0.1),
                                 secret=secret_of(cluster), request_timeout_s=10, init_timeout_s=30, **kw)


def test_non_chief_started_first_waits_for_chief_then_trains(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, chief=True)
    ps = start_ps(cluster)
    worker = session(cluster, "worker", 0)
    started = threading.Event()
    errors = []

    def run_worker():
        try:
            worker.start()
            started.set()
        except Exception as e:  # surfaced below
            errors.append(e)

    thread = threading.Thread(target=run_worker, daemon=True)
    thread.start()
    assert not started.wait(1.5), "a non-chief must wait for the chief to initialize"
    assert status(cluster).ready is False
    chief = session(cluster, "chief", 0).start()
    assert started.wait(15), errors
    worker.push(grads(1.0))
    chief.pull()
    np.testing.assert_allclose(chief.params["w"], variables()["w"] - 0.1)
    assert status(cluster).created == 2
    chief.close()
    worker.close()
    assert ps.wait(timeout=10) == 0


def test_restarted_chief_does_not_initialize_again(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    first = session(cluster, "worker", 0).start()
    first.push(grads(1.0))
    trained = {k: v.copy() for k, v in first.params.items()}
    first.ps.close()  # a crash: it never says done
    again = session(cluster, "worker", 0).start()
    assert status(cluster).created == 2
    for k in trained:
        np.testing.assert_array_equal(again.params[k], trained[k])
    assert again.global_step == 1
    again.close()


def test_late_worker_joins_at_current_step_async(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=2)
    ps = [start_ps(cluster, i) for i in range(2)]
    chief = session(cluster, "worker", 0, max_steps=5).start()
    while not chief.should_stop():
        chief.push(grads(1.0))
    late = session(cluster, "worker", 1).start()
    assert late.global_step == 5
    for k in chief.params:
        np.testing.assert_array_equal(late.params[k], chief.params[k])
    assert late.push(grads(1.0)).global_step == 6
    chief.close()
    assert ps[0].proc.poll() is None, "the ps must wait for every worker"
    late.close()
    assert [p.wait(timeout=10) for p in ps] == [0, 0]
    assert cluster.kill_all() == []
