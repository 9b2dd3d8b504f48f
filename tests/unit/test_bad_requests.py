"""What a server says about bad requests stays bounded: error texts cut at ERROR_TEXT_MAX, log
lines at most `burst` a window with the rest counted; and a ps whose serving thread fails exits
non-zero instead of looking finished."""

import logging

import pytest

import shoal
from shoal.launch.ports import free_ports
from shoal.ps.server import ServerFailed
from shoal.wire.bad_requests import ERROR_TEXT_MAX, BadRequestLog, bounded


def test_bounded_cuts_a_long_text_and_says_how_much_it_cut():
    assert bounded("short") == "short"
    cut = bounded("x" * (ERROR_TEXT_MAX + 500))
    assert cut.startswith("x" * ERROR_TEXT_MAX) and cut.endswith("... (500 more characters)")


def test_bad_request_lines_are_rate_limited_and_the_rest_counted(caplog):
    caplog.set_level(logging.WARNING)
    said = BadRequestLog(logging.getLogger("shoal.test"), "ps:0", every_s=60, burst=2)
    assert [said.refused(f"bad {i}", now=i) for i in range(5)] == [True, True, False, False, False]
    assert said.refused("y" * 10**6, now=61)  # a new window
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "ps:0 refused a malformed message from a peer: bad 0"
    assert lines[2].endswith("(3 more not logged in the last 60s)") and len(lines[2]) < ERROR_TEXT_MAX + 200


def test_a_ps_whose_serving_thread_fails_exits_non_zero_saying_why():
    port = free_ports(1)[0]
    server = shoal.Server({"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]},
                          secret=shoal.JobSecret(b"s" * 32, "test"))

    def broken_tick():
        raise RuntimeError("a bug in the chores")

    server.service.tick = broken_tick
    with pytest.raises(ServerFailed) as failed:
        server.join(timeout=10)
    assert failed.value.code == "ps:0: its serving thread failed, so this ps stops: RuntimeError('a bug in the chores')"
