"""What a ps's replicas say in its log: the first copy at INFO with its figures, each later one at
DEBUG, a summary at INFO once per interval, and the first copy after an outage at INFO again."""

import logging

from shoal.ps.replication_log import ReplicationLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(caplog, level):
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "shoal.ps.replicator"]


def test_the_first_copy_is_info_later_ones_debug_and_a_summary_comes_once_per_interval(caplog):
    caplog.set_level(logging.DEBUG, logger="shoal")
    clock = Clock()
    said = ReplicationLog(0, 1, summary_every_s=60, clock=clock)
    said.copied(10, 2, 4000, 0.5, 2.0, 10)
    for step in range(11, 71):  # a copy a second for 60 s
        clock.now += 1
        said.copied(step, 2, 4000, 0.5 if step % 2 else 1.5, 3.0, step - 1)
    assert lines(caplog, logging.INFO) == [
        "ps:0 replicated step 10 to ps:1: 2 tensors, 4.0 kB, copy 0.50 ms, send 2.0 ms (held: step 10)",
        "ps:0 replicated to ps:1 60 times in 60 s, last step 70 (copy 1.00 ms, send 3.0 ms: medians)"]
    assert len(lines(caplog, logging.DEBUG)) == 60
    clock.now += 1
    said.copied(71, 2, 4000, 0.5, 3.0, 70)
    assert len(lines(caplog, logging.INFO)) == 2  # the next summary waits for its interval


def test_a_copy_after_an_outage_is_said_at_info_again(caplog):
    caplog.set_level(logging.INFO, logger="shoal")
    said = ReplicationLog(1, 0, clock=Clock())
    said.copied(5, 1, 100, 0.1, 1.0, 5)
    said.copied(6, 1, 100, 0.1, 1.0, 6)
    said.resumed()
    said.copied(9, 1, 100, 0.1, 1.0, 9)
    assert [m.split(":", 2)[1] for m in lines(caplog, logging.INFO)] == ["1 replicated step 5 to ps", "1 replicates to ps",
                                                                         "1 replicated step 9 to ps"]
