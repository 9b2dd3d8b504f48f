"""IdlePsRestarts: which ps the chief asks after a rejoin, and which it rebuilds."""

import threading
from dataclasses import dataclass

import numpy as np

from shoal.train.idle_ps import REBUILD_RETRIES, IdlePsRestarts
from shoal.train.placement import PlacementStrategy, place_variables
from shoal.wire import PeerLostError, PeerTimeoutError, RemoteError

ADDRESSES = ("h:1", "h:2", "h:3")
# the softmax's two variables on ps 0 (one request per step): ps 1 and ps 2 hold nothing
PLACEMENT = place_variables({"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}, 3,
                            PlacementStrategy.GREEDY)


@dataclass
class Status:
    ready: bool
    incarnation: str


class Client:
    """The PsClient calls IdlePsRestarts makes, answering from `statuses` (an exception: raised)."""

    def __init__(self, statuses):
        self.addresses = ADDRESSES
        self.statuses = statuses
        self.probed: list[int] = []
        self.incarnations: dict[int, str] = {}

    def ps_id(self, ps):
        return ps

    def probe_status(self, ps, timeout_s):
        self.probed.append(ps)
        answer = self.statuses[ps]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def set_incarnation(self, ps, incarnation):
        self.incarnations[ps] = incarnation


def _restarts(rejoined_each_check):
    queue = list(rejoined_each_check)
    rebuilt: list[int] = []
    restarts = IdlePsRestarts("worker:0", lambda: frozenset(queue.pop(0)) if queue else frozenset(),
                              lambda client, ps: rebuilt.append(ps), threading.Lock())
    return restarts, rebuilt


def test_the_placement_leaves_ps_1_and_2_empty():
    assert [bool(PLACEMENT.on_ps(i)) for i in range(3)] == [True, False, False]


def test_nothing_is_asked_while_no_ps_counted_the_chief_joining_again():
    restarts, rebuilt = _restarts([()])
    client = Client({})
    restarts.check(client, PLACEMENT)
    assert client.probed == [] and rebuilt == []


def test_a_restarted_empty_ps_is_rebuilt_and_its_new_incarnation_remembered():
    restarts, rebuilt = _restarts([("h:2",)])
    client = Client({1: Status(ready=False, incarnation="new")})
    restarts.check(client, PLACEMENT)
    assert client.probed == [1] and rebuilt == [1] and client.incarnations == {1: "new"}


def test_a_ps_that_only_dropped_the_chief_and_is_ready_is_left_alone():
    restarts, rebuilt = _restarts([("h:3",)])
    client = Client({2: Status(ready=True, incarnation="same")})
    restarts.check(client, PLACEMENT)
    assert client.probed == [2] and rebuilt == []


def test_ps_0_and_ps_holding_shards_are_left_to_the_pushes():
    restarts, rebuilt = _restarts([("h:1",)])
    client = Client({0: Status(ready=False, incarnation="new")})
    restarts.check(client, PLACEMENT)
    assert client.probed == [] and rebuilt == []


def test_a_ps_that_does_not_answer_is_left_until_it_counts_the_chief_joining_again():
    """A ps that died again costs one probe, not one per step: a process started there later
    counts the chief as joining again, which brings it back."""
    restarts, rebuilt = _restarts([("h:2",), (), (), ("h:2",)])
    client = Client({1: PeerTimeoutError("no answer")})
    restarts.check(client, PLACEMENT)
    assert client.probed == [1] and rebuilt == []
    client.statuses[1] = Status(ready=False, incarnation="new")
    restarts.check(client, PLACEMENT)
    restarts.check(client, PLACEMENT)
    assert client.probed == [1], "a ps that did not answer is not asked again at every step"
    restarts.check(client, PLACEMENT)
    assert client.probed == [1, 1] and rebuilt == [1]


def test_a_rebuild_that_fails_is_logged_and_does_not_fail_the_chiefs_step():
    def failing(client, ps):
        raise PeerLostError("lost the connection to ps:1 while it handled 'init'", "ps:1")

    restarts = IdlePsRestarts("worker:0", lambda: frozenset({"h:2", "h:3"}), failing, threading.Lock())
    client = Client({1: Status(ready=False, incarnation="new"), 2: Status(ready=False, incarnation="new2")})
    restarts.check(client, PLACEMENT)  # no exception
    assert client.probed == [1, 2] and client.incarnations == {}


def test_a_rebuild_that_failed_on_a_ps_that_answers_is_tried_again_at_the_next_step():
    """CI, under load: the chief's own connection to the restarted ps was still catching up with
    the restart, so its `init` counted as lost; nothing brought the ps back, and a worker started
    later waited for it until its init timeout."""
    tries = []

    def rebuild(client, ps):
        tries.append(ps)
        if len(tries) == 1:
            raise PeerLostError("lost the connection to ps:1 at h:2 while it handled 'init' (did the task die?)",
                                "ps:1")

    queue = [{"h:2"}]  # then no ps counts the chief as joining again
    restarts = IdlePsRestarts("worker:0", lambda: frozenset(queue.pop(0)) if queue else frozenset(), rebuild,
                              threading.Lock())
    client = Client({1: Status(ready=False, incarnation="new")})
    restarts.check(client, PLACEMENT)
    assert tries == [1] and client.incarnations == {}
    restarts.check(client, PLACEMENT)
    assert tries == [1, 1] and client.incarnations == {1: "new"}
    restarts.check(client, PLACEMENT)
    assert tries == [1, 1] and client.probed == [1, 1]  # made ready: not asked again


def test_a_rebuild_that_keeps_failing_is_given_up_after_its_retries(caplog):
    def failing(client, ps):
        raise PeerLostError("lost the connection to ps:1 while it handled 'init'", "ps:1")

    restarts = IdlePsRestarts("worker:0", iter([frozenset({"h:2"})] + [frozenset()] * 9).__next__, failing,
                              threading.Lock())
    client = Client({1: Status(ready=False, incarnation="new")})
    for _ in range(6):
        restarts.check(client, PLACEMENT)
    assert client.probed == [1] * (1 + REBUILD_RETRIES)
    assert f"failed {1 + REBUILD_RETRIES} times before it was made ready" in caplog.text


def test_a_rebuild_the_ps_refused_is_not_tried_again():
    tries = []

    def refused(client, ps):
        tries.append(ps)
        raise RemoteError("ps:1 at h:2 refused 'init': it runs sync training", "ps:1")

    queue = [{"h:2"}]
    restarts = IdlePsRestarts("worker:0", lambda: frozenset(queue.pop(0)) if queue else frozenset(), refused,
                              threading.Lock())
    client = Client({1: Status(ready=False, incarnation="new")})
    for _ in range(3):
        restarts.check(client, PLACEMENT)
    assert tries == [1] and client.probed == [1]
