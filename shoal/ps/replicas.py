"""`ReplicaBook`: the copies of other ps tasks' shards one ps holds (shard replication, issue 14).

The ps tasks form a ring (shoal/ps/ring.py): ps k sends a whole copy of its shards to its
successor every so often (`replicate`, shoal/ps/replicator.py); the successor holds it here, apart
from its own shards, until the chief asks for it (`replica`) to rebuild ps k after a restart.
Without placement changes ps k's successor is ps (k + 1) % n; when the ring changes (a ps re-homed
or joined) the server tells the book its new predecessor (`follow`). The book is bounded: it
holds exactly one replica and takes replicas only from its current predecessor; a new one replaces
the held one whole. A replica of a former predecessor stays held until the new predecessor's
first one replaces it, and `reply` answers only for the source a replica is of, so it is never
handed out as another ps's.
A replica of the same process (incarnation) that is older than the one held is refused, so
replies that overtake each other never roll the held copy back; one from a new process of the
predecessor (rebuilt after a restart) replaces the held one whatever its step.

Pure bookkeeping: no I/O; not thread-safe (the ps's serving thread only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from shoal.ps.errors import PsError
from shoal.ps.protocol import ReplicaReply, ReplicateRequest, split_slots


class ReplicaError(PsError):
    """A replica that this ps does not take (wrong sender, no tensors, slots without values...)."""


@dataclass(frozen=True)
class HeldReplica:
    """One predecessor's shards as it sent them, with what its `replicate` said of them."""

    request: ReplicateRequest
    tensors: Mapping[str, np.ndarray]
    received_at: float

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


class ReplicaBook:
    """The replica ps `ps_index` of a ring of `num_ps` holds: its predecessor's, at most one
    (ps (ps_index - 1) % num_ps until `follow` names another). `clock` is time.monotonic unless a
    test injects one. Not thread-safe."""

    def __init__(self, ps_index: int, num_ps: int, *, clock: Callable[[], float] = time.monotonic):
        if not 0 <= ps_index < num_ps:
            raise ReplicaError(f"ps index {ps_index} is outside a ring of {num_ps} ps tasks")
        self.ps_index = ps_index
        self.num_ps = num_ps
        self._clock = clock
        self._held: HeldReplica | None = None
        self._predecessor: int | None = (ps_index - 1) % num_ps if num_ps > 1 else None

    @property
    def predecessor(self) -> int | None:
        """The ps whose replicas this one takes; None when it takes none (a single ps, or this ps
        is not in the ring)."""
        return self._predecessor

    def follow(self, predecessor: int | None) -> None:
        """Take replicas from ps `predecessor` from now on (the ring changed: shoal/ps/ring.py);
        None: from no ps. The held replica stays until the new predecessor's replaces it."""
        self._predecessor = predecessor

    @property
    def held(self) -> HeldReplica | None:
        return self._held

    def accept(self, request: ReplicateRequest, tensors: Mapping[str, np.ndarray]) -> int:
        """Hold `tensors` as the replica of `request.source`, replacing the one held. Returns
        the step of the replica held afterwards (an older one of the same process is ignored).
        Raises ReplicaError, holding what it held before, for a sender that is not this ps's
        predecessor or tensors that are not a ps's shards."""
        me = f"ps:{self.ps_index}"
        if self.predecessor is None or request.source != self.predecessor:
            want = ("none (the job has one ps, or the ring has no place for this ps)" if self.predecessor is None
                    else f"only ps:{self.predecessor}'s")
            raise ReplicaError(f"{me} got a replica of ps:{request.source}, but holds {want}; every ps task must "
                               "be started with the same cluster and follow the same placement history (the ring "
                               "is the live ps by cluster index: shoal/ps/ring.py); a sender whose ring changed "
                               "first tries again at its next interval")
        values, slots = split_slots(tensors)
        if not values:
            raise ReplicaError(f"{me} got a replica of ps:{request.source} without any shard values")
        orphans = sorted(slots.keys() - values.keys())
        if orphans:
            raise ReplicaError(f"{me} got a replica of ps:{request.source} with optimizer state for "
                               f"{orphans[:5]} but not their values")
        held = self._held
        if held is not None and held.request.incarnation == request.incarnation and held.request.step > request.step:
            return held.request.step
        self._held = HeldReplica(request, dict(tensors), self._clock())
        return request.step

    def reply(self, source: int) -> tuple[ReplicaReply, Mapping[str, np.ndarray] | None]:
        """What `replica` answers for ps `source`: the held replica and its tensors, or
        present=False and None."""
        held = self._held
        if held is None or held.request.source != source:
            return ReplicaReply(False, source), None
        r = held.request
        age_ms = int(max(0.0, self._clock() - held.received_at) * 1000)
        return ReplicaReply(True, source, r.incarnation, r.step, r.training, r.rule, r.leases, age_ms), held.tensors
