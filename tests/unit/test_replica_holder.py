"""Which ps the chief asks for a lost ps's replica (shoal/train/replica_source.py): the ring is the
cluster's (ps k -> ps (k + 1) % n, by cluster index), whatever the client's numbering after a ps
was re-homed (dropped) or joined (added). Answered without asking any ps."""

import numpy as np

from shoal.ps.client import PsClient
from shoal.ps.optimizers import SGD
from shoal.ps.protocol import ASYNC
from shoal.train.placement import PlacementStrategy, place_variables
from shoal.train.replica_source import fetch_replica
from shoal.wire import JobSecret

SECRET = JobSecret(b"s" * 32, "test")
PARAMS = {"W": np.zeros((64, 10)), "b": np.zeros(10)}


def fetch(client, ps):
    placement = place_variables(PARAMS, client.num_ps, PlacementStrategy.GREEDY, 1024)
    return fetch_replica(client, placement, PARAMS, ps, SGD(0.1), ASYNC, timeout_s=0.2)


def test_a_ps_that_joined_the_running_job_has_no_replica_in_the_ring():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2"], SECRET, timeout_s=0.2)
    client.add("127.0.0.1:3", 2)
    try:
        assert fetch(client, 2) == (None, "ps:2 joined the running job and is not in the replica ring")
    finally:
        client.close()


def test_the_replica_of_a_ps_whose_successor_was_rehomed_is_not_looked_for_on_another_ps():
    client = PsClient(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], SECRET, timeout_s=0.2)
    client.drop(2)  # ps:2, which held ps:1's replica, was re-homed
    try:
        assert fetch(client, 1) == (None, "ps:2, which held its replica, was re-homed")
    finally:
        client.close()
