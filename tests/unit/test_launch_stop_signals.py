"""StopSignals: the first stop signal stops the job gracefully, an echo of it (the same Ctrl-C
delivered twice, as `timeout` forwards it) is ignored, a later second one skips the grace
period; `shoal kill`'s fresh mark names it in the reason. The handler prints nothing."""

import os
import signal
import time

from shoal.launch.kill_request import FRESH_S, KILL_MARK, mark_kill_requested, withdraw_kill_request
from shoal.launch.stop_signals import ECHO_S, StopSignals


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _handler(tmp_path):
    requests, clock = [], _Clock()
    return StopSignals(tmp_path, requests.append, clock), requests, clock


def test_an_echo_of_the_first_signal_is_not_a_second_request(tmp_path):
    handler, requests, clock = _handler(tmp_path)
    handler(signal.SIGINT)
    clock.now += 0.01
    handler(signal.SIGINT)  # timeout's forwarded copy
    clock.now += ECHO_S / 2
    handler(signal.SIGTERM)
    assert requests == ["the launcher got SIGINT"]


def test_a_second_signal_later_is_a_second_request(tmp_path):
    handler, requests, clock = _handler(tmp_path)
    handler(signal.SIGINT)
    clock.now += ECHO_S + 0.5
    handler(signal.SIGINT)
    assert requests == ["the launcher got SIGINT", "the launcher got SIGINT twice"]


def test_sigterm_after_shoal_kills_mark_names_shoal_kill(tmp_path):
    handler, requests, _ = _handler(tmp_path)
    mark_kill_requested(tmp_path)
    handler(signal.SIGTERM)
    assert requests == ["stopped by shoal kill"]


def test_a_stale_or_withdrawn_mark_does_not_name_shoal_kill(tmp_path):
    mark_kill_requested(tmp_path)
    old = time.time() - FRESH_S - 1
    os.utime(tmp_path / KILL_MARK, (old, old))  # e.g. a kill whose signal was never sent, long ago
    handler, requests, _ = _handler(tmp_path)
    handler(signal.SIGTERM)
    mark_kill_requested(tmp_path)
    withdraw_kill_request(tmp_path)
    other, more, _ = _handler(tmp_path)
    other(signal.SIGTERM)
    assert requests == more == ["the launcher got SIGTERM"]
    handler_in_gone_dir, gone, _ = _handler(tmp_path / "no-such-dir")
    handler_in_gone_dir(signal.SIGTERM)  # never raises in the handler
    assert gone == ["the launcher got SIGTERM"]


def test_the_mark_says_who_asked_and_only_its_owner_may_read_it(tmp_path):
    from shoal.launch.kill_request import kill_requested_by
    assert kill_requested_by(tmp_path) is None
    mark_kill_requested(tmp_path, by="Ctrl-C")
    assert kill_requested_by(tmp_path) == "Ctrl-C"
    assert (tmp_path / KILL_MARK).stat().st_mode & 0o777 == 0o600
    stops = []
    StopSignals(tmp_path, stops.append)(signal.SIGTERM)
    assert stops == ["stopped by Ctrl-C"]
