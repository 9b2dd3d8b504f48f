"""`overlap_push`: an async push returns before its answer, and the next push, a pull and the
session's end wait for it first; a real ps process, a session in this process."""

import numpy as np
import pytest

import shoal
from shoal.train.errors import TrainError
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, variables


def _session(cluster, index=0, **options) -> shoal.TrainingSession:
    return shoal.TrainingSession(config_for(cluster, "worker", index), variables(), shoal.SGD(0.1),
                                 secret=secret_of(cluster), request_timeout_s=10, **options)


def test_a_push_returns_before_its_answer_and_the_next_one_takes_it_in(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=2)  # worker:1 reads what the ps holds after worker:0 left
    start_ps(cluster)
    start = variables()
    with _session(cluster, overlap_push=True) as session:
        first = session.push(grads(1.0))
        assert first.global_step == 0 and first.applied is None  # nothing answered yet: the step it was sent at
        np.testing.assert_array_equal(session.params["w"], start["w"])  # its values not taken in yet
        second = session.push(grads(2.0))
        assert second.global_step == 1 and second.applied  # the first push's answer
        np.testing.assert_allclose(session.params["w"], start["w"] - 0.1)
        assert session.pull() == 2  # waits for the second push first
        np.testing.assert_allclose(session.params["w"], start["w"] - 0.1 - 0.2)
        third = session.push(grads(1.0))
        assert third.global_step == 2
    # leaving the session (no pull) waited for the third push and took its answer in
    assert session.global_step == 3
    np.testing.assert_allclose(session.params["w"], start["w"] - 0.4, rtol=1e-6)
    with _session(cluster, 1) as reader:  # and the ps applied each push once
        assert reader.global_step == 3
        np.testing.assert_allclose(reader.params["w"], start["w"] - 0.4, rtol=1e-6)


def test_without_overlap_a_push_returns_with_its_own_answer(make_cluster):
    """The same pushes without overlap_push: the test above's first assertion would fail."""
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    with _session(cluster) as session:
        assert session.push(grads(1.0)).global_step == 1
        np.testing.assert_allclose(session.params["w"], variables()["w"] - 0.1)


def test_overlap_push_with_sync_training_is_refused_before_anything_starts(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    with pytest.raises(TrainError, match=r"overlap_push \(--overlap_push\) is for asynchronous training"):
        _session(cluster, overlap_push=True, sync=True)


def test_a_closure_push_is_refused_with_overlap_push(make_cluster):
    cluster = make_cluster(num_ps=1, num_workers=1)
    start_ps(cluster)
    with _session(cluster, overlap_push=True) as session:
        with session.closure("c-1"), pytest.raises(TrainError, match="leave it off under a coordinator"):
            session.push(grads(1.0))
