"""The launcher's stop signals around a job's setup (shoal/launch/setup_signals.py): between the
setup and the runner's handlers both SIGTERM and Ctrl-C are remembered, not raised; inside the
setup Ctrl-C raises as usual; once the job ended Ctrl-C raises again, SIGTERM stays remembered."""

import os
import signal

import pytest

from shoal.launch.setup_signals import stop_like_ctrl_c, stops_deferred


def test_stops_between_setup_and_runner_are_remembered_first_one_kept_and_handlers_put_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with stops_deferred() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == signal.SIGINT
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_ctrl_c_raises_inside_the_setup_and_is_remembered_again_after_it():
    with stops_deferred() as stop:
        with pytest.raises(KeyboardInterrupt):
            with stop_like_ctrl_c():
                os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal == signal.SIGINT


def test_once_the_job_ended_ctrl_c_raises_and_sigterm_stays_remembered():
    with stops_deferred() as stop:
        stop.stop_deferring_ctrl_c()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
