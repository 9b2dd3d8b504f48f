"""`TrainingSession.watch_ps` with a real ps process: a chief that never pushes (a coordinator's)
rebuilds a ps that was killed and started again, with no request of its own reaching it."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import shoal
from shoal.train.errors import TrainError
from shoal.train.ps_watch import WatchState
from shoal.wire import WireError
from tests.cluster.ps_process import config_for, secret_of, start_ps, status, variables


def _wait_for_status(cluster, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = status(cluster, 0, timeout_s=2)
            if predicate(s):
                return s
        except WireError:
            pass
        assert time.monotonic() < deadline, f"{what} within {timeout}s\n{cluster.dump()}"
        time.sleep(0.05)


def test_a_watching_chief_rebuilds_a_restarted_ps_that_none_of_its_requests_reached(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, chief=True)
    ps = start_ps(cluster)
    model = variables()
    with shoal.TrainingSession(config_for(cluster, "chief", 0), model, shoal.SGD(0.1), secret=secret_of(cluster),
                               init_timeout_s=30, ps_recovery_timeout_s=30) as session:
        before = _wait_for_status(cluster, lambda s: s.ready, 10, "the ps ready")
        watch = session.watch_ps(every_s=0.2)
        assert watch.state is WatchState.WATCHING
        os.killpg(ps.proc.pid, signal.SIGKILL)
        ps.wait(10)
        start_ps(cluster)
        after = _wait_for_status(cluster, lambda s: s.ready and s.incarnation != before.incarnation, 30,
                                 "the restarted ps rebuilt")
        assert after.shards == before.shards and after.step == before.step
        session.pull()  # its values are the chief's copy (one ps and no model_dir: no replica, no checkpoint)
        for name, value in model.items():
            np.testing.assert_array_equal(session.params[name], value)
        deadline = time.monotonic() + 10
        while watch.recoveries != 1:  # it counts the recovery once `recover` returned, just after the rebuild
            assert time.monotonic() < deadline, f"recoveries: {watch.recoveries}"
            time.sleep(0.05)
    assert watch.state is WatchState.CLOSED  # closing the session closed its watch


def test_watch_ps_is_refused_on_a_worker_and_twice_on_the_chief(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1, chief=True)
    start_ps(cluster)
    secret = secret_of(cluster)
    with shoal.TrainingSession(config_for(cluster, "chief", 0), variables(), shoal.SGD(0.1), secret=secret,
                               init_timeout_s=30) as chief:
        with chief.watch_ps():
            with pytest.raises(TrainError, match="already watches"):
                chief.watch_ps()
        with chief.watch_ps():  # a closed watch may be replaced
            pass
        with shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1), secret=secret,
                                   init_timeout_s=30) as worker:
            with pytest.raises(TrainError, match=r"only the chief \(chief:0\) rebuilds a ps"):
                worker.watch_ps()
