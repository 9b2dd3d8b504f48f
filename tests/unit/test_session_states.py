"""TrainingSession's life: NEW -> STARTED -> CLOSED, with a clear error for a call in the wrong state.
No processes: the constructor does no I/O, and a start that cannot reach a ps fails in time."""

import socket

import numpy as np
import pytest

import shoal
from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.wire import JobSecret


def unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def new_session(**kw):
    spec = ClusterSpec.from_dict({"ps": [unused_address()], "worker": ["127.0.0.1:1"]})
    return shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), {"w": np.zeros(2, np.float32)},
                                 shoal.SGD(0.1), secret=JobSecret(b"s", "test"), **kw)


@pytest.mark.parametrize("name, call", [("push", lambda s: s.push({"w": np.ones(2)})), ("pull", lambda s: s.pull()),
                                        ("end_job", lambda s: s.end_job()),
                                        ("save_checkpoint", lambda s: s.save_checkpoint()),
                                        ("run_step", lambda s: s.run_step(lambda p: (0.0, {"w": np.ones(2)})))])
def test_calls_before_start_say_to_start_first(name, call):
    session = new_session()
    with pytest.raises(shoal.TrainError, match=rf"{name}\(\) needs a started session; call start\(\) first"):
        call(session)
    assert session.state is shoal.SessionState.NEW


def test_calls_after_close_say_the_session_is_closed():
    session = new_session()
    session.close()
    session.close()  # idempotent
    assert session.state is shoal.SessionState.CLOSED
    for call in (session.start, session.pull):
        with pytest.raises(shoal.TrainError, match="closed session; create a new TrainingSession"):
            call()


def test_failed_start_leaves_the_session_new():
    session = new_session(init_timeout_s=0.5, request_timeout_s=0.5)
    with pytest.raises(shoal.TrainError, match="parameter servers did not come up within 0.5s"):
        session.start()
    assert session.state is shoal.SessionState.NEW


def test_secret_is_required():
    spec = ClusterSpec.from_dict({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})
    with pytest.raises(TypeError, match="secret"):
        shoal.TrainingSession(ClusterConfig(spec, TaskId("worker", 0)), {"w": np.zeros(2)}, shoal.SGD(0.1))
