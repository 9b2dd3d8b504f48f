"""The replica ring as the placement history makes it (shard replication, issue 14).

The ring is the live ps tasks by cluster index: the ps the job started with, minus those
re-homed (RETIRE), plus those that joined (JOIN), sorted; each sends its replica to the next live
index after its own, wrapping. Every task computes it from the same start and history, so a ps
sends its replica to the very ps the chief later asks for it. With an empty history this is
ps k -> ps (k + 1) % n, as before.

Pure functions; thread-safe.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from shoal.ps.protocol import ChangeKind, PlacementChange


def ring_members(start_ids: Iterable[int], history: Sequence[PlacementChange]) -> list[int]:
    """The live ps tasks (cluster indexes, ascending) after `history`, from `start_ids`."""
    live = set(start_ids)
    for change in history:
        if change.kind is ChangeKind.RETIRE:
            live.discard(change.ps)
        else:
            live.add(change.ps)
    return sorted(live)


def ring_successor(start_ids: Iterable[int], history: Sequence[PlacementChange], ps: int) -> int | None:
    """The ps that holds ps `ps`'s replica: the next live index after `ps`, wrapping. None when
    `ps` is not live (re-homed, or not joined yet) or is the only live ps."""
    ring = ring_members(start_ids, history)
    if ps not in ring or len(ring) < 2:
        return None
    return ring[(ring.index(ps) + 1) % len(ring)]


def ring_predecessor(start_ids: Iterable[int], history: Sequence[PlacementChange], ps: int) -> int | None:
    """The ps whose replica ps `ps` holds: the live index before `ps`, wrapping. None when `ps`
    is not live or is the only live ps."""
    ring = ring_members(start_ids, history)
    if ps not in ring or len(ring) < 2:
        return None
    return ring[(ring.index(ps) - 1) % len(ring)]


def joined_address(history: Sequence[PlacementChange], ps: int) -> str | None:
    """The address ps `ps` joined at, as its latest JOIN in `history` says; None if it never joined."""
    for change in reversed(history):
        if change.kind is ChangeKind.JOIN and change.ps == ps:
            return change.address
    return None
