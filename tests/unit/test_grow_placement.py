"""The placement after a ps joined (shoal/train/grow_placement.py) and its history
(shoal/train/placement_history.py): whole shards move, largest first, from the most-loaded ps to
the new one while that lowers the largest load; every task computes the same; a history of
re-homings and joins replayed at once equals applying it step by step, to the placement and to
the PsClient's numbering of its ps."""

import numpy as np
import pytest

from shoal.ps.client import PsClient
from shoal.ps.protocol import ChangeKind, PlacementChange
from shoal.train.errors import TrainError
from shoal.train.grow_placement import grow, moved_from
from shoal.train.placement import Placement, PlacementStrategy, ShardPlacement, place_variables
from shoal.train.placement_history import PlacementBook, replay
from shoal.train.rehome_placement import rehome
from shoal.wire import JobSecret

SECRET = JobSecret(b"s" * 32, "test")


def shard(name, ps, nbytes):
    return ShardPlacement(name, name, ps, 0, 1, nbytes)


def loads(placement):
    out = [0] * placement.num_ps
    for s in placement.shards:
        out[s.ps] += s.nbytes
    return out


def test_grow_moves_largest_shards_from_the_most_loaded_ps_while_the_maximum_drops():
    old = Placement((shard("a", 0, 100), shard("b", 0, 60), shard("c", 1, 50), shard("d", 1, 40), shard("e", 0, 10)), 2)
    new = grow(old)
    assert new.num_ps == 3
    # ps 0 (170) gives a (100): 70 / 90 / 100; then ps 2 is the largest: nothing more would lower the maximum
    assert {s.name: s.ps for s in new.shards} == {"a": 2, "b": 0, "c": 1, "d": 1, "e": 0}
    assert max(loads(new)) < max(loads(old))
    assert moved_from(old, new) == {0: ["a"]}
    assert [s.name for s in new.shards] == [s.name for s in old.shards]  # shard order (push parts) unchanged


def test_grow_takes_from_several_ps_and_breaks_ties_by_the_lowest_index():
    old = Placement(tuple(shard(f"s{ps}{i}", ps, 10) for ps in range(2) for i in range(3)), 2)
    new = grow(old)
    assert loads(new) == [20, 20, 20]
    assert moved_from(old, new) == {0: ["s00"], 1: ["s10"]}


def test_grow_never_moves_a_ps_only_shard():
    old = Placement((shard("a", 0, 100), shard("b", 1, 1)), 2)
    new = grow(old)
    assert new.num_ps == 3 and moved_from(old, new) == {}


def test_every_task_computes_the_same_grown_placement():
    variables = {f"v{i}": np.zeros(100 * (i + 1)) for i in range(7)}
    assert grow(place_variables(variables, 3, PlacementStrategy.GREEDY, 256)) == grow(
        place_variables(variables, 3, PlacementStrategy.GREEDY, 256))


def test_replay_of_a_mixed_history_equals_applying_it_step_by_step():
    start = place_variables({f"v{i}": np.zeros(64 * (i + 2)) for i in range(9)}, 3, PlacementStrategy.GREEDY, 128)
    history = [PlacementChange(ChangeKind.JOIN, 3, "h:3"), PlacementChange(ChangeKind.RETIRE, 1),
               PlacementChange(ChangeKind.JOIN, 4, "h:4"), PlacementChange(ChangeKind.RETIRE, 0)]
    step = grow(start)  # ps 0, 1, 2, 3
    step = rehome(step, 1)  # ps 0, 2, 3
    step = grow(step)  # ps 0, 2, 3, 4
    step = rehome(step, 0)  # ps 2, 3, 4
    placement, ids = replay(start, [0, 1, 2], history)
    assert placement == step and ids == [2, 3, 4]
    # in two pieces, as a worker that learned part of it earlier
    first, first_ids = replay(start, [0, 1, 2], history[:2])
    assert replay(first, first_ids, history[2:]) == (step, [2, 3, 4])


def test_replay_refuses_a_join_of_a_ps_already_in_the_placement_naming_it():
    start = Placement((shard("a", 0, 1),), 1)
    with pytest.raises(TrainError, match="ps:0 joins"):
        replay(start, [0], [PlacementChange(ChangeKind.JOIN, 0, "h:1")])


def test_book_catch_up_applies_the_history_to_the_placement_and_the_client():
    start = place_variables({"W": np.zeros((64, 10)), "b": np.zeros(10)}, 2, PlacementStrategy.GREEDY, 1024)
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2"], SECRET, timeout_s=1.0)
    book = PlacementBook(start)
    history = (PlacementChange(ChangeKind.JOIN, 2, "127.0.0.1:3"), PlacementChange(ChangeKind.RETIRE, 1))
    assert book.catch_up(client, history[:1]) == list(history[:1])
    assert book.catch_up(client, history) == list(history[1:])
    assert book.catch_up(client, history) == []
    assert client.addresses == ("127.0.0.1:1", "127.0.0.1:3") and [client.ps_id(k) for k in range(2)] == [0, 2]
    assert book.placement == replay(start, [0, 1], history)[0] and book.retired == [1]
    with pytest.raises(TrainError, match="differs"):
        book.catch_up(client, (PlacementChange(ChangeKind.RETIRE, 1),))
    client.close()


def test_client_add_is_the_inverse_of_drop_and_refuses_a_ps_it_has():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2"], SECRET, timeout_s=1.0)
    assert client.add("127.0.0.1:3", 2) == 2
    assert client.num_ps == 3 and [client.ps_id(k) for k in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="ps:1"):
        client.add("127.0.0.1:9", 1)
    client.drop(2)
    assert client.addresses == ("127.0.0.1:1", "127.0.0.1:2")
    client.close()


def test_book_undo_join_restores_the_placement_and_the_client_and_undoes_nothing_else():
    """The chief takes back a join when the ps that registered does not answer (nothing moved)."""
    start = place_variables({"W": np.zeros((64, 10)), "b": np.zeros(10)}, 2, PlacementStrategy.GREEDY, 1024)
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2"], SECRET, timeout_s=1.0)
    book = PlacementBook(start)
    book.join(client, 2, "127.0.0.1:3")
    assert book.placement.num_ps == 3 and client.num_ps == 3
    book.undo_join(client, start)
    assert book.placement == start and book.history == []
    assert client.addresses == ("127.0.0.1:1", "127.0.0.1:2") and [client.ps_id(k) for k in range(2)] == [0, 1]
    book.retire(client, 1)
    with pytest.raises(TrainError, match="only a join that moved nothing is undone"):
        book.undo_join(client, start)
    assert book.retired == [1]
    client.close()
