"""The placement after a ps joined a running job (issue 14): shards move onto the new ps.

The new ps is numbered `num_ps` (after every ps of the placement), as `PsClient.add` numbers it.
Shard boundaries stay as they are: whole shards move (with their optimizer state), largest first,
from the most-loaded ps (ties: the lowest index) to the new one, as long as each move lowers
that ps's load below the current maximum without raising the new ps's to it. So a ps never gives
its only shard away, and ps 0 keeps at least one (its lease book and async global step are not
shards and never move). Every task computes the same result from the same placement.

Pure: no I/O; thread-safe.
"""

from __future__ import annotations

from shoal.train.placement import Placement, ShardPlacement


def grow(placement: Placement) -> Placement:
    """`placement` with one more ps (index `placement.num_ps`) holding the shards moved onto it."""
    new = placement.num_ps
    load = [0] * placement.num_ps
    for s in placement.shards:
        load[s.ps] += s.nbytes
    home = {s.name: s.ps for s in placement.shards}
    new_load = 0
    while True:
        peak = max(load)
        move = None
        for ps in (i for i in range(placement.num_ps) if load[i] == peak):
            fits = [s for s in placement.shards if home[s.name] == ps and new_load + s.nbytes < peak]
            if fits:
                move = max(fits, key=lambda s: s.nbytes)  # the first of the largest: shard order breaks ties
                break
        if move is None:
            break
        load[home[move.name]] -= move.nbytes
        home[move.name] = new
        new_load += move.nbytes
    shards = tuple(ShardPlacement(s.variable, s.name, home[s.name], s.start, s.stop, s.nbytes)
                   for s in placement.shards)
    return Placement(shards, placement.num_ps + 1)


def moved_from(old: Placement, new: Placement) -> dict[int, list[str]]:
    """Per ps of `old` that gave shards to the ps that joined (`old.num_ps` in `new`), their names
    in shard order."""
    before = {s.name: s.ps for s in old.shards}
    out: dict[int, list[str]] = {}
    for s in new.shards:
        if s.ps == old.num_ps:
            out.setdefault(before[s.name], []).append(s.name)
    return dict(sorted(out.items()))
