"""The placement after re-homing (issue 14): a ps that never came back leaves the group, and its
shards move to the survivors.

Shard boundaries stay as they are (a shard moves whole, with its optimizer state), so only the
dead ps's shards move; each goes, largest first, to the survivor holding the fewest bytes (ties:
the lowest index), as the greedy balancer places them at the start, among the survivors that
hold a shard: one that holds none (more ps than the model needs) never got a push, so in sync
mode its step is still the one it started at, and shards of the job's step cannot join it (ps 0
always holds a shard, and is never re-homed). The survivors keep their order and are numbered
0..n-2, as the worker's PsClient numbers them once it dropped the dead ps (`PsClient.drop`). Every task computes the same result from the same placement, so the
survivors and every worker agree without a metadata service.

Pure: no I/O; thread-safe.
"""

from __future__ import annotations

from shoal.train.errors import TrainError
from shoal.train.placement import Placement, ShardPlacement


def rehome(placement: Placement, dead: int) -> Placement:
    """`placement` without ps `dead` (an index of it): its shards on the survivors."""
    if not 0 <= dead < placement.num_ps:
        raise TrainError(f"cannot re-home ps:{dead}: the placement has ps 0..{placement.num_ps - 1}")
    if placement.num_ps < 2:
        raise TrainError(f"cannot re-home ps:{dead}: it is the job's only ps, no other can hold its shards")
    survivors = placement.num_ps - 1

    def renumber(ps: int) -> int:
        return ps if ps < dead else ps - 1

    load = [0] * survivors
    holds = [False] * survivors
    for s in placement.shards:
        if s.ps != dead:
            load[renumber(s.ps)] += s.nbytes
            holds[renumber(s.ps)] = True
    takers = [i for i in range(survivors) if holds[i]] or list(range(survivors))
    home: dict[str, int] = {}
    for s in sorted((s for s in placement.shards if s.ps == dead), key=lambda s: -s.nbytes):
        target = min(takers, key=lambda i: (load[i], i))
        load[target] += s.nbytes
        home[s.name] = target
    shards = tuple(ShardPlacement(s.variable, s.name, home[s.name] if s.ps == dead else renumber(s.ps), s.start,
                                  s.stop, s.nbytes) for s in placement.shards)
    return Placement(shards, survivors)


def moved_to(old: Placement, new: Placement, dead: int) -> dict[int, list[str]]:
    """Per survivor (an index of `new`), the names of the shards of ps `dead` it holds now."""
    was_dead = {s.name for s in old.on_ps(dead)}
    out: dict[int, list[str]] = {}
    for s in new.shards:
        if s.name in was_dead:
            out.setdefault(s.ps, []).append(s.name)
    return out
