"""`TrainingSession.watch_ps` with a real ps process: a chief that never pushes (a coordinator's)
rebuilds a ps that was killed and started again, with no request of its own reaching it."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import shoal
from shoal.train.errors import TrainError
from shoal.train.ps_watch import WatchState
from shoal.wire import WireError
from tests.cluster.ps_process import config_for, secret_of, start_ps, status, variables


def _wait_for_status(cluster, predicate, timeout, what, index=0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = status(cluster, index, timeout_s=2)
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
        ps.kill()
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


def _three_variables() -> dict[str, np.ndarray]:
    """Three variables of one size: round-robin placement puts one on each of three ps (greedy
    would keep such small ones together)."""
    return {name: np.full((64, 4), k, np.float32) for k, name in enumerate(("a", "b", "c"))}


def _wait_for_log(caplog, text, timeout, what):
    deadline = time.monotonic() + timeout
    while not any(text in r.getMessage() for r in list(caplog.records)):
        assert time.monotonic() < deadline, f"{what} within {timeout}s\n{caplog.text}"
        time.sleep(0.05)


def test_a_watching_chief_rebuilds_a_restarted_ps_by_the_numbering_after_its_session_rehomed_another(
        make_cluster, caplog):
    caplog.set_level(logging.INFO, logger="shoal")
    cluster = make_cluster(num_ps=3, num_workers=1, chief=True)
    ps = [start_ps(cluster, i) for i in range(3)]
    with shoal.TrainingSession(config_for(cluster, "chief", 0), _three_variables(), shoal.SGD(0.1),
                               placement=shoal.PlacementStrategy.ROUND_ROBIN,
                               secret=secret_of(cluster), init_timeout_s=30, ps_recovery_timeout_s=2,
                               min_shard_bytes=1 << 20) as session:
        assert [len(session.placement.on_ps(i)) for i in range(3)] == [1, 1, 1]
        watch = session.watch_ps(every_s=0.2)
        ps[1].kill()  # never comes back
        session.pull()  # finds ps:1 lost and re-homes it
        assert session.placement.num_ps == 2, cluster.dump()
        rehomed_at = len(caplog.records)  # the watch may have tried ps:1 before the session re-homed it
        before = status(cluster, 2)
        assert before.ready and before.shards >= 1
        ps[2].kill()
        start_ps(cluster, 2)
        after = _wait_for_status(cluster, lambda s: s.ready and s.incarnation != before.incarnation, 30,
                                 "the restarted ps:2 rebuilt", index=2)
        assert (after.shards, after.nbytes) == (before.shards, before.nbytes), caplog.text
        since = [r.getMessage() for r in caplog.records[rehomed_at:]]
        assert not any("could not recover ps:1" in m for m in since), since  # the retired ps is no longer watched
        assert _eventually(lambda: watch.recoveries == 1, 10), watch.recoveries


def test_the_sessions_recovery_gets_its_whole_timeout_after_waiting_for_the_watchs(make_cluster, caplog):
    caplog.set_level(logging.INFO, logger="shoal")
    cluster = make_cluster(num_ps=2, num_workers=1, chief=True)
    ps = [start_ps(cluster, i) for i in range(2)]
    timeout_s = 8
    with shoal.TrainingSession(config_for(cluster, "chief", 0), _three_variables(), shoal.SGD(0.1),
                               placement=shoal.PlacementStrategy.ROUND_ROBIN,
                               secret=secret_of(cluster), init_timeout_s=30, ps_recovery_timeout_s=timeout_s,
                               min_shard_bytes=1 << 20) as session:
        assert session.placement.on_ps(1)
        session.watch_ps(every_s=0.2)
        ps[1].kill()
        _wait_for_log(caplog, "lost ps:1", 10, "the watch noticed ps:1 lost")

        def restart_once_the_watch_gave_up():  # the session then still has time to rebuild it
            _wait_for_log(caplog, "could not recover ps:1", timeout_s + 10, "the watch gave up on ps:1")
            start_ps(cluster, 1)

        restarter = threading.Thread(target=restart_once_the_watch_gave_up, daemon=True)
        restarter.start()
        session.pull()  # waits for the lock the watch holds, then for ps:1
        restarter.join(timeout_s + 15)
        assert session.placement.num_ps == 2 and session.placement.on_ps(1), "ps:1 was re-homed, not rebuilt"
        assert status(cluster, 1).ready


def _eventually(predicate, timeout) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
