"""PushOverlap: one push in flight; the next push, `settle` and a failure handle it in order."""

import pytest

from shoal.train.options import StepResult
from shoal.train.push_overlap import PushOverlap


class Recorder:
    """What the overlap asked for, in order; `fail_finish` makes finishing that push raise."""

    def __init__(self, fail_finish=None):
        self.calls = []
        self.fail_finish = fail_finish

    def send(self, push):
        self.calls.append(("send", push))
        return push

    def finish(self, push):
        self.calls.append(("finish", push))
        if push == self.fail_finish:
            raise RuntimeError(f"push {push} failed")
        return StepResult(push, True)


def make(recorder):
    return PushOverlap(recorder.send, recorder.finish, lambda: StepResult(0, True))


def test_each_push_finishes_the_one_before_it_first_and_returns_its_result():
    r = Recorder()
    overlap = make(r)
    assert overlap.push(1) == StepResult(0, True) and overlap.in_flight
    assert overlap.push(2) == StepResult(1, True)
    assert r.calls == [("send", 1), ("finish", 1), ("send", 2)]
    assert overlap.settle() == StepResult(2, True) and not overlap.in_flight
    assert overlap.settle() is None


def test_a_push_whose_predecessor_failed_is_not_sent_and_nothing_stays_in_flight():
    r = Recorder(fail_finish=1)
    overlap = make(r)
    overlap.push(1)
    with pytest.raises(RuntimeError, match="push 1 failed"):
        overlap.push(2)
    assert ("send", 2) not in r.calls and not overlap.in_flight
    assert overlap.settle() is None


def test_drop_forgets_the_push_in_flight_without_waiting():
    r = Recorder()
    overlap = make(r)
    overlap.push(1)
    overlap.drop()
    assert not overlap.in_flight and overlap.settle() is None
    assert r.calls == [("send", 1)]
