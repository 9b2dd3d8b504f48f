"""StopSignals: the first stop signal stops the job gracefully, an echo of it (the same Ctrl-C
delivered twice, as `timeout` forwards it) is ignored, a later second one skips the grace
period and says so; `shoal kill`'s mark names it in the reason."""

import signal

from shoal.launch.kill_request import mark_kill_requested
from shoal.launch.stop_signals import ECHO_S, StopSignals


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _handler(tmp_path):
    requests, notes, clock = [], [], _Clock()
    return StopSignals(tmp_path, requests.append, notes.append, clock), requests, notes, clock


def test_an_echo_of_the_first_signal_is_not_a_second_request(tmp_path):
    handler, requests, notes, clock = _handler(tmp_path)
    handler(signal.SIGINT)
    clock.now += 0.01
    handler(signal.SIGINT)  # timeout's forwarded copy
    clock.now += ECHO_S / 2
    handler(signal.SIGTERM)
    assert requests == ["the launcher got SIGINT"] and notes == []


def test_a_second_signal_later_skips_the_grace_period_and_says_so(tmp_path):
    handler, requests, notes, clock = _handler(tmp_path)
    handler(signal.SIGINT)
    clock.now += ECHO_S + 0.5
    handler(signal.SIGINT)
    assert requests == ["the launcher got SIGINT", "the launcher got SIGINT twice"]
    assert notes == ["shoal | SIGINT again: stopping every task now (SIGKILL), without waiting out the grace period"]


def test_sigterm_after_shoal_kills_mark_names_shoal_kill(tmp_path):
    handler, requests, _, _ = _handler(tmp_path)
    mark_kill_requested(tmp_path)
    handler(signal.SIGTERM)
    assert requests == ["stopped by shoal kill"]
