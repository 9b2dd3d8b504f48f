"""A worker waiting at start for a ps that was lost learns the re-homing from the others only
once every ps that answers reports it: the chief hands the lost ps's shards to the survivors
one after another, and a survivor that has not adopted its part yet must not be asked for it."""

import time

import numpy as np

from shoal.ps.protocol import ChangeKind, Phase, PlacementChange, StatusReply
from shoal.train.placement import place_variables
from shoal.train.placement_history import PlacementBook, apply_history, learn_history, settled_history
from shoal.train.recovery import wait_for_ps
from shoal.wire import PeerTimeoutError

RETIRE_1 = (PlacementChange(ChangeKind.RETIRE, 1),)


def _status(history=()):
    return StatusReply(Phase.READY, None, 5, 1, 8, 1, (), "inc", history=history,
                       retired=tuple(c.ps for c in history if c.kind is ChangeKind.RETIRE))


class ThreePs:
    """ps:1 is gone; `answers(poll, ps)` says what ps:0 and ps:2 answer at each poll."""

    def __init__(self, answers):
        self._ids, self.addresses, self.polls, self._answers = [0, 1, 2], ["h:0", "h:1", "h:2"], 0, answers

    @property
    def num_ps(self):
        return len(self._ids)

    def ps_id(self, k):
        return self._ids[k]

    def drop(self, k):
        del self._ids[k]
        del self.addresses[k]

    def status_each(self, timeout_s):
        self.polls += 1
        return [PeerTimeoutError("gone") if i == 1 else self._answers(self.polls, i) for i in self._ids]


def test_the_history_counts_once_every_ps_that_answers_reports_it_and_it_retires_the_others():
    client = ThreePs(None)
    gone = PeerTimeoutError("gone")
    assert settled_history(client, [_status(RETIRE_1), gone, _status(())]) is None  # ps:2 has not adopted yet
    assert settled_history(client, [_status(RETIRE_1), gone, _status(RETIRE_1)]) == RETIRE_1
    assert settled_history(client, [gone, gone, _status(RETIRE_1)]) is None  # ps:0 silent: it is not retired
    joined = (*RETIRE_1, PlacementChange(ChangeKind.JOIN, 3, "h:3"))
    assert settled_history(client, [_status(joined), gone, _status(RETIRE_1)]) is None  # ps:2 not told of the join
    assert settled_history(client, [_status(joined), gone, _status(joined)]) == joined
    other = (PlacementChange(ChangeKind.RETIRE, 2),)
    assert settled_history(client, [_status(RETIRE_1), gone, _status(other)]) is None  # they disagree
    again = _status(())  # a process started again at ps:1's address, after the re-homing: not asked
    assert settled_history(client, [_status(RETIRE_1), again, _status(RETIRE_1)]) == RETIRE_1


def _wait(client, book):
    def learn(results):
        history = settled_history(client, results)
        return (history is not None and len(history) > len(book.history)
                and apply_history(book, client, history, "worker:2") is not None)
    return wait_for_ps(client, "worker:2", time.monotonic() + 10, 10, learn=learn)


def test_a_survivor_that_has_not_adopted_yet_is_not_asked_for_the_moved_shards():
    params = {f"v{i}": np.zeros((64, 8), np.float32) for i in range(6)}
    book = PlacementBook(place_variables(params, 3, min_shard_bytes=64))
    client = ThreePs(lambda poll, ps: _status(RETIRE_1 if ps == 0 or poll >= 5 else ()))  # ps:2 adopts at poll 5
    statuses = _wait(client, book)
    assert client.polls >= 5 and [s.retired for s in statuses] == [(1,), (1,)]
    assert book.placement.num_ps == 2


def test_a_poll_where_only_an_older_history_answers_is_not_an_error():
    book = PlacementBook(place_variables({"w": np.zeros((64, 8), np.float32), "b": np.zeros(8, np.float32),
                                         "c": np.zeros(16, np.float32)}, 3, min_shard_bytes=64))

    def answers(poll, ps):  # poll 1: only ps:0 adopted; poll 2: ps:0 slow, ps:2 not yet; then both
        if ps == 0:
            return PeerTimeoutError("slow") if poll == 2 else _status(RETIRE_1)
        return _status(() if poll <= 2 else RETIRE_1)
    client = ThreePs(answers)
    _wait(client, book)
    assert book.history == list(RETIRE_1) and client.polls >= 3


def test_a_worker_starting_during_a_rehoming_learns_it_once_every_survivor_adopted():
    params = {f"v{i}": np.zeros((64, 8), np.float32) for i in range(6)}
    book = PlacementBook(place_variables(params, 3, min_shard_bytes=64))
    client = ThreePs(lambda poll, ps: _status(RETIRE_1 if ps == 0 or poll >= 4 else ()))  # ps:2 adopts at poll 4
    placement = learn_history(book, client, time.monotonic() + 10, "worker:2")
    assert placement is not None and placement.num_ps == 2 and client.polls == 4


def test_a_history_that_does_not_settle_is_taken_as_the_longest_reported(monkeypatch):
    """A ps that lost its history in a restart (its `place` failed) would keep it from settling."""
    monkeypatch.setattr("shoal.train.placement_history.SETTLE_S", 0.3)
    book = PlacementBook(place_variables({f"v{i}": np.zeros((64, 8), np.float32) for i in range(3)}, 3,
                                         min_shard_bytes=64))
    client = ThreePs(lambda poll, ps: _status(RETIRE_1 if ps == 0 else ()))
    started = time.monotonic()
    assert learn_history(book, client, started + 10, "worker:2") is not None
    assert book.history == list(RETIRE_1) and 0.3 <= time.monotonic() - started < 5
