"""The replica ring follows the placement history (issue 14): the live ps by cluster index, each
sending to the next live index; the replica book takes replicas from the predecessor it is told;
the chief asks the successor by its own history. No processes."""

import numpy as np
import pytest

from shoal.ps.client import PsClient
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import ASYNC, ChangeKind, PlacementChange, ReplicateRequest
from shoal.ps.replicas import ReplicaBook, ReplicaError
from shoal.ps.ring import joined_address, ring_members, ring_predecessor, ring_successor
from shoal.train.placement import PlacementStrategy, place_variables
from shoal.train.replica_source import fetch_replica
from shoal.wire import JobSecret

SECRET = JobSecret(b"s" * 32, "test")
PARAMS = {"W": np.zeros((64, 10)), "b": np.zeros(10)}


def retire(ps):
    return PlacementChange(ChangeKind.RETIRE, ps)


def join(ps, address="127.0.0.1:9"):
    return PlacementChange(ChangeKind.JOIN, ps, address)


def test_successor_is_the_next_cluster_index_when_the_history_is_empty():
    assert [ring_successor(range(3), (), c) for c in range(3)] == [1, 2, 0]


def test_successor_wraps_to_a_ps_that_joined():
    history = (join(2),)
    assert [ring_successor(range(2), history, c) for c in range(3)] == [1, 2, 0]
    assert ring_predecessor(range(2), history, 0) == 2


def test_successor_skips_a_retired_ps():
    history = (retire(1),)
    assert ring_successor(range(3), history, 0) == 2
    assert ring_successor(range(3), history, 2) == 0
    assert ring_successor(range(3), history, 1) is None  # re-homed: in no ring


def test_successor_over_a_mixed_history_sorts_by_cluster_index():
    history = (retire(1), join(3), retire(0), join(4))
    assert ring_members(range(3), history) == [2, 3, 4]
    assert [ring_successor(range(3), history, c) for c in (2, 3, 4)] == [3, 4, 2]
    assert [ring_predecessor(range(3), history, c) for c in (2, 3, 4)] == [4, 2, 3]


def test_successor_is_none_for_the_last_ps_left_or_one_not_joined_yet():
    assert ring_successor(range(2), (retire(1),), 0) is None
    assert ring_successor(range(2), (), 2) is None


def test_joined_address_is_the_latest_join_of_that_ps():
    history = (join(2, "127.0.0.1:7"), join(3, "127.0.0.1:8"))
    assert joined_address(history, 2) == "127.0.0.1:7" and joined_address(history, 0) is None


def replicate(source, incarnation):
    return ReplicateRequest(source, incarnation, 5, ASYNC, SGD(1.0).to_config())


def test_book_takes_the_replica_of_the_predecessor_it_follows_and_refuses_the_former_one():
    book = ReplicaBook(0, 2)  # ps:0 of 2: ps:1's replica
    book.accept(replicate(1, "a" * 16), {"w": np.ones(3)})
    book.follow(2)  # ps:2 joined: 1 -> 2 -> 0
    with pytest.raises(ReplicaError, match=r"replica of ps:1, but holds only ps:2's"):
        book.accept(replicate(1, "a" * 16), {"w": np.ones(3)})
    assert book.reply(2)[0].present is False  # ps:1's replica is never answered as ps:2's
    book.accept(replicate(2, "b" * 16), {"w": np.zeros(3)})
    assert book.reply(2)[0].present and not book.reply(1)[0].present


def fetch(client, ps, history):
    placement = place_variables(PARAMS, client.num_ps, PlacementStrategy.GREEDY, 1024)
    return fetch_replica(client, placement, PARAMS, ps, SGD(0.1), ASYNC, timeout_s=0.2, history=history)


def test_the_replica_of_a_ps_that_joined_is_asked_of_its_successor_by_the_history():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2"], SECRET, timeout_s=0.2)
    client.add("127.0.0.1:3", 2)
    try:
        replica, why = fetch(client, 2, (join(2, "127.0.0.1:3"),))
        assert replica is None and why.startswith("ps:0, which holds its replica, did not give it")
    finally:
        client.close()


def test_the_replica_of_a_ps_whose_successor_was_rehomed_is_asked_of_the_next_live_ps():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], SECRET, timeout_s=0.2)
    client.drop(2)  # ps:2, which held ps:1's replica, was re-homed: ps:1 now sends to ps:0
    try:
        replica, why = fetch(client, 1, (retire(2),))
        assert replica is None and why.startswith("ps:0, which holds its replica, did not give it")
    finally:
        client.close()
