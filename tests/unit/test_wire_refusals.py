"""RefusalLog's rate limits, with an injected clock: one line per (address, reason) and
interval, a bound on lines in all, and a bound on what it remembers."""

import logging

from shoal.wire.refusals import RefusalLog

log = logging.getLogger("shoal.test.refusals")


def messages(caplog):
    return [r.getMessage() for r in caplog.records]


def test_repeated_refusals_of_one_address_are_counted_into_the_next_line(caplog):
    caplog.set_level(logging.WARNING, logger="shoal")
    refusals = RefusalLog(log, "ps:0", every_s=60)
    assert refusals.refused("10.0.0.5", "bad secret", now=0)
    assert not any(refusals.refused("10.0.0.5", "bad secret", now=t) for t in (1, 2, 3))
    assert refusals.refused("10.0.0.5", "bad secret", now=61)
    assert messages(caplog) == ["ps:0 refused a peer at 10.0.0.5: bad secret",
                                "ps:0 refused a peer at 10.0.0.5: bad secret (3 more from it in the last 60s)"]


def test_a_flood_of_addresses_logs_at_most_burst_lines_per_interval(caplog):
    caplog.set_level(logging.WARNING, logger="shoal")
    refusals = RefusalLog(log, "ps:0", every_s=60, burst=3)
    for i in range(10):
        refusals.refused(f"10.0.0.{i}", "bad secret", now=1)
    assert len(caplog.records) == 3
    refusals.refused("10.0.1.1", "bad secret", now=62)
    assert messages(caplog)[-1].endswith("(7 other refusals not logged)")


def test_it_remembers_at_most_max_keys_addresses():
    refusals = RefusalLog(log, "ps:0", every_s=60, burst=1000, max_keys=4)
    for i in range(100):
        refusals.refused(f"10.0.0.{i}", "bad secret", now=1)
    assert len(refusals._seen) == 4
