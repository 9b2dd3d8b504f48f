"""`wait_for_chief` with a stand-in PsClient whose ps answer, break and come back on a schedule:
a ps lost during the wait goes to the recovery strategy, the wait lasts until the recovery's
deadline when the ps came back, and a ps that answers nothing for long counts as lost."""

import time

import pytest

from shoal.ps.protocol import Phase, StatusReply
from shoal.train import recovery
from shoal.train.errors import TrainError
from shoal.train.recovery import PsRecovery, wait_for_chief
from shoal.wire import PeerLostError, PeerTimeoutError


def _status(phase: Phase) -> StatusReply:
    return StatusReply(phase, None, 0, 0, 0, 0, (), "inc")


class ScheduledPs:
    """Two ps: ps:0 is ready; ps:1's connection breaks at the first poll (`breaks`), or it just
    never answers (`silent`), until `back_at`; it is READY from `ready_at` on (EMPTY before)."""

    timeout_s, recovery_timeout_s, num_ps = 60.0, 3.0, 2
    addresses = ("127.0.0.1:1", "127.0.0.1:2")

    def __init__(self, back_at: float, ready_at: float, *, breaks: bool = True):
        self.back_at, self.ready_at, self.breaks = back_at, ready_at, breaks

    def ps_id(self, ps: int) -> int:
        return ps

    def _ps1(self) -> StatusReply:
        now = time.monotonic()
        if now < self.back_at:
            raise PeerTimeoutError("ps:1 did not answer")
        return _status(Phase.READY if now >= self.ready_at else Phase.EMPTY)

    def status(self, ps: int, timeout_s: float) -> StatusReply:
        return _status(Phase.READY) if ps == 0 else self._ps1()

    def status_each(self, timeout_s: float):
        if self.breaks:
            self.breaks = False
            return [_status(Phase.READY), PeerLostError("lost the connection to ps:1", "ps:1")]
        try:
            return [_status(Phase.READY), self._ps1()]
        except PeerTimeoutError as e:
            return [_status(Phase.READY), e]


def test_a_ps_back_within_its_recovery_timeout_is_waited_for_past_the_init_deadline_until_restored():
    now = time.monotonic()
    client = ScheduledPs(back_at=now + 1.0, ready_at=now + 1.5)  # back 1 s after the loss (3 s allowed)
    statuses = wait_for_chief(client, "worker:1", "worker:0", deadline=now + 0.5, total_s=0.5,
                              on_lost=PsRecovery("worker:1", "worker:0", 3.0).recover_before_start)
    assert all(s.ready for s in statuses)
    assert time.monotonic() - now >= 1.5


def test_a_ps_that_does_not_come_back_fails_the_wait_after_its_recovery_timeout_naming_it():
    now = time.monotonic()
    client = ScheduledPs(back_at=now + 60, ready_at=now + 60)
    client.recovery_timeout_s = 1.0
    with pytest.raises(TrainError, match=r"worker:1: lost the connection to ps:1, while it waited for the chief "
                                         r"\(worker:0\) to initialize the variables, and it did not come back within 1s"):
        wait_for_chief(client, "worker:1", "worker:0", deadline=now + 30, total_s=30,
                       on_lost=PsRecovery("worker:1", "worker:0", 1.0).recover_before_start)
    assert time.monotonic() - now < 10


def test_a_ps_that_answers_nothing_for_long_counts_as_lost(monkeypatch):
    """A vanished machine sends no reset: only timeouts come back, and each poll connects anew."""
    monkeypatch.setattr(recovery, "SILENT_AS_LOST_S", 0.5)
    monkeypatch.setattr(recovery, "PROBE_TIMEOUT_S", 0.05)
    now = time.monotonic()
    client = ScheduledPs(back_at=now + 60, ready_at=now + 60, breaks=False)
    causes = []

    def on_lost(client, ps, deadline, cause):
        causes.append((ps, cause))
        raise TrainError("given up")

    with pytest.raises(TrainError, match="given up"):
        wait_for_chief(client, "worker:1", "worker:0", deadline=now + 30, total_s=30, on_lost=on_lost)
    [(ps, cause)] = causes
    assert ps == 1 and isinstance(cause, PeerLostError) and cause.peer_name == "ps:1"
    assert "ps:1 at 127.0.0.1:2 answered nothing for" in str(cause)
    assert 0.5 <= time.monotonic() - now < 10
