"""SIGTERM as a request to finish, without processes: the process-wide flag and its handler, the
session part that saves and raises at a step boundary, the ps's drain policy, and a draining ps
giving up a sync step that the replicas still training can no longer complete."""

import io
import os
import signal
import subprocess
import sys
import textwrap

import socket

import numpy as np
import pytest

import shoal.sigterm as sigterm
from shoal.ps.draining import TermDrain
from shoal.ps.protocol import DoneRequest, FailedRequest, HeartbeatRequest, Mode, PushOutcome, TrainingMode
from shoal.ps.server import Server, ServerTerminated
from shoal.train.progress import ProgressReporter
from shoal.train.shutdown import EXIT_STATUS, GracefulStop, TrainingTerminated
from shoal.wire import JobSecret

from tests.unit.test_ps_service import make_service, push, request

SYNC_2 = TrainingMode(Mode.SYNC, 2)


def run_python(program: str) -> subprocess.CompletedProcess:
    """`program` in a fresh interpreter: SIGTERM's handler is process-wide, and this test
    process may hold sessions of other tests."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program)], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def test_sigterm_sets_the_flag_instead_of_ending_the_process_and_release_restores_the_default():
    out = run_python("""
        import os, signal
        import shoal.sigterm as sigterm
        assert sigterm.acquire() and sigterm.acquire()
        os.kill(os.getpid(), signal.SIGTERM)  # os.kill runs the handler before it returns
        print("requested" if sigterm.requested() else "not seen")
        sigterm.release()
        print("still ours" if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL else "default")
        sigterm.release()
        print("default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "still ours")
    """)
    assert out.stdout.split() == ["requested", "still", "ours", "default"], out.stderr
    assert out.returncode == 0


def test_sigterm_leaves_a_handler_the_program_installed_alone():
    out = run_python("""
        import signal
        import shoal.sigterm as sigterm
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        print(sigterm.acquire())
        sigterm.release()
        print(signal.getsignal(signal.SIGTERM) is mine)
    """)
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_a_second_sigterm_ends_the_process_as_the_default_action_would():
    program = """
        import os, signal, sys, time
        import shoal.sigterm as sigterm
        sigterm.acquire()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print("first: requested" if sigterm.requested() else "first: not seen", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("survived the second", flush=True)
    """
    out = run_python(program)
    assert out.stdout == "first: requested\n"
    assert out.returncode == -signal.SIGTERM


def test_graceful_stop_saves_then_raises_training_terminated_once_sigterm_came():
    stop = GracefulStop("worker:0")
    saved = []
    stop.open()
    try:
        stop.stop(7, lambda: saved.append(7))  # no SIGTERM yet: nothing happens
        assert saved == []
        sigterm.request()
        with pytest.raises(TrainingTerminated) as caught:
            stop.stop(8, lambda: saved.append(8) or "ckpt-8")
    finally:
        stop.close()
        sigterm.clear()  # this test process goes on
    assert saved == [8]
    assert caught.value.code == EXIT_STATUS == 143
    assert str(caught.value) == "worker:0 stopped training at global step 8 on SIGTERM; final checkpoint ckpt-8"
    assert not isinstance(caught.value, Exception)  # `except Exception` in a training loop does not swallow it


def test_graceful_stop_still_raises_when_the_final_save_fails(caplog):
    stop = GracefulStop("chief:0")
    stop.open()
    try:
        sigterm.request()

        def broken():
            raise OSError("disk full")

        with pytest.raises(TrainingTerminated):
            stop.stop(3, broken)
    finally:
        stop.close()
        sigterm.clear()
    assert "could not save a final checkpoint at step 3 on SIGTERM: disk full" in caplog.text


@pytest.mark.parametrize("now, unfinished, chief_finished, last, stops", [
    (100.0, 2, False, None, "no training replica ever connected"),
    (100.0, 0, True, 99.0, "every training replica has finished"),
    (100.0, 1, True, 99.0, "the chief has finished"),
    (100.0, 1, False, 99.0, None),                        # the chief may still save
    (109.0, 1, False, 50.0, None),                        # quiet since the SIGTERM at 100, but < 10 s
    (110.5, 1, False, 50.0, "none sent a request for 10s"),
])
def test_drain_keeps_a_ps_serving_until_the_chief_is_through(now, unfinished, chief_finished, last, stops):
    why = TermDrain(term_at=100.0, idle_s=10.0).stop_reason(
        now, unfinished_replicas=unfinished, chief_finished=chief_finished, last_request_at=last)
    assert (why is None) if stops is None else (stops in why)


def test_draining_sync_ps_completes_a_step_without_the_replica_that_stopped_a_step_earlier():
    service, _ = make_service(training=SYNC_2)
    push(service, "worker:0", 0)
    push(service, "worker:1", 0)                       # step 0 done: both at step 1
    assert service.drain() == []
    assert push(service, "worker:0", 1) == []          # worker:1 may still come: wait
    (ack, done) = service.handle(request(FailedRequest("worker:1")))  # it stopped at step 1
    assert done.request.header["task"] == "worker:0"   # the step completes with the one gradient it has
    assert done.body.outcome is PushOutcome.APPLIED and done.body.step == 2
    np.testing.assert_array_equal(done.tensors["w"], np.full(3, -2.0))  # averaged over 1 gradient, not 2


def test_sync_step_completes_without_a_replica_that_failed_and_takes_it_back_at_the_next_step():
    service, _ = make_service(training=SYNC_2)
    assert push(service, "worker:0", 0, 2.0) == []
    (ack, applied) = service.handle(request(FailedRequest("worker:1")))  # it may be restarted and come back
    assert applied.body.outcome is PushOutcome.APPLIED and applied.body.step == 1
    np.testing.assert_array_equal(applied.tensors["w"], np.full(3, -2.0))  # worker:0's gradient alone
    service.handle(request(HeartbeatRequest("worker:1", "restarted", 5000)))  # its new process rejoins
    assert push(service, "worker:0", 1) == []          # step 1 waits for both again


class _Session:
    task = "worker:0"
    summaries = None

    def __init__(self, checkpointer):
        self.checkpointer = checkpointer


class _Checkpointer:
    saves = 3


def test_progress_line_counts_the_chiefs_checkpoints_and_only_the_chiefs():
    out = io.StringIO()
    ProgressReporter(_Session(_Checkpointer()), every=1, batch_size=10, out=out).step_done(0.5, 42)
    assert out.getvalue().startswith("worker:0 step=42 loss=0.5000 examples/s=")
    assert out.getvalue().endswith(" checkpoints=3\n")
    out = io.StringIO()
    ProgressReporter(_Session(None), every=1, batch_size=10, out=out).step_done(0.5, 42)
    assert "checkpoints" not in out.getvalue()


def _lone_ps():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Server({"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]}, "ps", 0,
                  secret=JobSecret(b"x" * 32, "test"))


def test_ps_that_gets_sigterm_after_every_replica_finished_returns_as_usual():
    """The launcher stops the ps once the workers succeeded: that ps exits 0, not 143."""
    server = _lone_ps().start()
    try:
        server.service.handle(request(DoneRequest("worker:0")))
        sigterm.request()
        assert server.join(timeout=10) is True
    finally:
        server.stop()
        sigterm.clear()


def test_ps_that_gets_sigterm_before_its_replicas_finished_ends_with_server_terminated():
    server = _lone_ps()
    sigterm.request()
    try:
        with pytest.raises(ServerTerminated) as caught:
            server.join(timeout=10)  # no replica ever connected: it stops at once
    finally:
        server.stop()
        sigterm.clear()
    assert caught.value.code == 143 and "no training replica ever connected" in str(caught.value)


def test_the_stop_line_names_the_checkpoints_step_where_pushes_of_others_came_after_this_ones_last(tmp_path):
    saved = tmp_path / "checkpoints" / "ckpt-0000046383"
    assert str(TrainingTerminated("chief:0", 46382, saved)) == (
        f"chief:0 stopped training at global step 46382 on SIGTERM; final checkpoint {saved} (step 46383: the other"
        " replicas' pushes since included)")
    assert str(TrainingTerminated("chief:0", 46383, saved)).endswith(f"final checkpoint {saved}")


def test_training_terminated_is_importable_from_shoal_as_the_readme_names_it():
    import shoal
    from shoal.train.shutdown import TrainingTerminated as where_it_lives

    assert shoal.TrainingTerminated is where_it_lives and "TrainingTerminated" in dir(shoal)
