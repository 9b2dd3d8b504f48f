"""Where the chief rebuilds a restarted ps from: the replica its successor in the ring holds
(shard replication, issue 14), checked to fit the ps's place in this job.

`fetch_replica` asks the ps's successor in the ring for its replica of ps `ps` and returns it
with the reason it cannot be used, if it cannot. The ring is the live ps of the placement history
by cluster index (shoal/ps/ring.py), the history being the chief's own (its PlacementBook's);
with an empty history it is the cluster's, ps k -> ps (k + 1) % n. Blocks on one request (bounded by `timeout_s`); not
thread-safe (it uses the caller's PsClient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from shoal.ps.client import PsClient
from shoal.ps.optimizers import UpdateRule
from shoal.ps.protocol import PlacementChange, ReplicaReply, TrainingMode, split_slots
from shoal.ps.ring import ring_successor
from shoal.train.placement import Placement
from shoal.wire import WireError


@dataclass(frozen=True)
class Replica:
    """A ps's shards as its successor holds them: tensors ready for `init` (values and
    "<shard>@<slot>"), the step they are of, and who holds them."""

    holder: int
    reply: ReplicaReply
    tensors: Mapping[str, np.ndarray]

    @property
    def step(self) -> int:
        return self.reply.step

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def successor(ps: int, num_ps: int) -> int | None:
    """The ps that holds ps `ps`'s replica; None in a job with one ps."""
    return (ps + 1) % num_ps if num_ps > 1 else None


def fetch_replica(client: PsClient, placement: Placement, params: Mapping[str, np.ndarray], ps: int,
                  optimizer: UpdateRule, training: TrainingMode, timeout_s: float,
                  history: Sequence[PlacementChange] = ()) -> tuple[Replica | None, str]:
    """ps `ps`'s replica from its successor in the ring after `history` (the caller's placement
    history), or None and why there is none to use (the successor is down, holds none, or one
    that does not fit this job's model, placement, optimizer or mode)."""
    cluster_id = client.ps_id(ps)
    ids = [client.ps_id(k) for k in range(client.num_ps)]
    if history:
        holder_id = ring_successor(range(client.ring), history, cluster_id)
        if holder_id is None:
            return None, f"no other ps is in the replica ring with ps:{cluster_id}, so none holds its replica"
        if holder_id not in ids:
            return None, f"ps:{holder_id}, its successor in the replica ring, is not one this task talks to"
    else:
        if cluster_id >= client.ring:
            return None, f"ps:{cluster_id} joined the running job and is not in the replica ring"
        holder_id = successor(cluster_id, client.ring)  # the ring is the cluster's, by cluster index
        if holder_id is None:
            return None, "the job has one ps, so no other ps holds a replica"
        if holder_id not in ids:
            return None, f"ps:{holder_id}, which held its replica, was re-homed"
    holder = ids.index(holder_id)
    try:
        answer = client.replica(holder, cluster_id, timeout_s)
    except WireError as e:
        return None, f"ps:{holder_id}, which holds its replica, did not give it ({e})"
    reply: ReplicaReply = answer.body
    if not reply.present:
        return None, (f"ps:{holder_id} holds no replica of it (replication is off, ps:{holder_id} restarted too, "
                      "or none was sent yet)")
    if reply.source != cluster_id:  # a holder answers only for the ps its replica is of; never hand out another's
        return None, f"ps:{holder_id} answered with a replica of ps:{reply.source}, not of ps:{cluster_id}"
    values, _ = split_slots(answer.tensors)
    want = {s.name: s for s in placement.on_ps(ps)}
    if values.keys() != want.keys():
        return None, (f"ps:{holder_id}'s replica holds shards {sorted(values)[:5]}, this job places "
                      f"{sorted(want)[:5]} on it")
    for name, s in want.items():
        model = s.rows(params[s.variable])
        if values[name].shape != model.shape or values[name].dtype != model.dtype:
            return None, (f"ps:{holder_id}'s replica of shard {name!r} is "
                          f"{values[name].dtype}{list(values[name].shape)}, this job's is {model.dtype}{list(model.shape)}")
    if reply.rule != optimizer.to_config() or reply.training != training:
        return None, (f"ps:{holder_id}'s replica was trained with {reply.rule} in {reply.training} mode, this job "
                      f"uses {optimizer.to_config()} in {training} mode")
    return Replica(holder, reply, answer.tensors), ""
