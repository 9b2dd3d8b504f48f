"""Where each variable lives: which ps task holds which rows of it.

Every task computes the placement itself from the same variables, ps count and options, so
no metadata service is needed; the ps checks names, shapes and dtypes on every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

import numpy as np

from shoal.train.errors import TrainError

DEFAULT_MIN_SHARD_BYTES = 256 << 10
DEFAULT_PUSH_PART_BYTES = 256 << 10
REQUEST_COST_BYTES = 64 << 10
"""What one more request per step costs, counted in bytes, for the greedy placement (the
default; shoal/train/shard_costs.py picks by where the ps are): a ps that holds nothing yet
gets a request of its own every step once it holds a shard. Across hosts 64 KiB is ~0.5 ms of
a 1 Gbit/s link, and a request's fixed CPU (~115 us, worker and ps) less than that."""


class PlacementStrategy(Enum):
    ROUND_ROBIN = "round_robin"   # shards go to ps 0, 1, 2, ... in the order variables are given
    GREEDY = "greedy"             # largest shard first, by bytes and by a request's cost, the better (`_greedy`)


@dataclass(frozen=True)
class ShardPlacement:
    """Rows [start, stop) of `variable` (all of it for a scalar), held by ps task `ps`."""

    variable: str
    name: str
    ps: int
    start: int
    stop: int
    nbytes: int

    def rows(self, array: np.ndarray) -> np.ndarray:
        """This shard's part of `array` (the variable, or anything shaped like it): a view of
        rows [start, stop), or `array` itself when the shard is the whole variable. The one
        place that slices a shard out of a variable."""
        if array.ndim == 0 or (self.start == 0 and self.stop == len(array)):
            return array
        return array[self.start:self.stop]


@dataclass(frozen=True)
class Placement:
    shards: tuple[ShardPlacement, ...]
    num_ps: int

    def on_ps(self, ps: int) -> list[ShardPlacement]:
        return [s for s in self.shards if s.ps == ps]

    def split(self, arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Per ps task, shard name -> view of its rows (no copy). Arrays must be C-contiguous."""
        out: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_ps)]
        for s in self.shards:
            out[s.ps][s.name] = s.rows(arrays[s.variable])
        return out

    def push_parts(self, part_bytes: int | None, first_ps: int = 0) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """The messages a push is sent in: (ps, shard names), each holding shards of one ps of at
        most `part_bytes` together (a larger shard alone; one message per ps when `part_bytes` is
        None), each ps's in shard order. A ps answers each message as soon as its shards are
        updated, so a worker's upload of one part overlaps the download of the one before.

        The ps take turns, starting at `first_ps` (give each replica its own, e.g. its replica
        index): part 1 of ps k, part 1 of ps k+1, ..., part 2 of ps k, ... Workers that all sent
        every part to ps 0 first, then to ps 1, shared ps 0's link while ps 1's idled, and in sync
        mode no ps could answer before every worker's part for it came; taking turns from
        different ps keeps every link busy (bench/README.md, "Parts that take turns")."""
        per_ps: list[list[tuple[str, ...]]] = []
        for ps in range(self.num_ps):
            groups: list[tuple[str, ...]] = []
            group: list[str] = []
            size = 0
            for s in self.on_ps(ps):
                if group and part_bytes is not None and size + s.nbytes > part_bytes:
                    groups.append(tuple(group))
                    group, size = [], 0
                group.append(s.name)
                size += s.nbytes
            if group:
                groups.append(tuple(group))
            per_ps.append(groups)
        order = [(first_ps + k) % self.num_ps for k in range(self.num_ps)]
        rounds = max((len(groups) for groups in per_ps), default=0)
        return tuple((ps, per_ps[ps][r]) for r in range(rounds) for ps in order if r < len(per_ps[ps]))


def place_variables(variables: Mapping[str, np.ndarray], num_ps: int,
                    strategy: PlacementStrategy = PlacementStrategy.GREEDY,
                    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                    part_bytes: int | None = None, request_cost_bytes: int = REQUEST_COST_BYTES) -> Placement:
    """Partition variables larger than 2 x `min_shard_bytes` along their first axis into at
    most `num_ps` shards of at least `min_shard_bytes`, and assign shards to ps tasks. With
    `part_bytes`, a variable is also cut into shards of at most about `part_bytes` (so a push
    can travel in parts, see `Placement.push_parts`). GREEDY counts `request_cost_bytes` for
    each ps that holds a shard (see `_greedy`)."""
    if part_bytes is not None and part_bytes < 1:
        raise TrainError(f"push part size {part_bytes} must be a positive number of bytes (or None: one part per ps)")
    if num_ps < 1:
        raise TrainError("the cluster has no ps tasks; add at least one to cluster.ps (or --ps_hosts)")
    if not variables:
        raise TrainError("no variables to place; give the session the model's initial values")
    pieces: list[tuple[str, str, int, int, int]] = []
    for name, value in variables.items():
        rows = value.shape[0] if value.ndim else 1
        parts = 1
        if value.ndim and value.nbytes >= 2 * min_shard_bytes:
            parts = max(1, min(num_ps, value.nbytes // min_shard_bytes, rows))
        if value.ndim and part_bytes is not None:
            parts = min(rows, max(parts, -(-value.nbytes // part_bytes)))
        bounds = np.linspace(0, rows, parts + 1).round().astype(int)
        row_bytes = value.nbytes // rows if rows else 0
        for i in range(parts):
            shard_name = name if parts == 1 else f"{name}/part_{i}"
            pieces.append((name, shard_name, int(bounds[i]), int(bounds[i + 1]),
                           (int(bounds[i + 1]) - int(bounds[i])) * row_bytes if value.ndim else value.nbytes))
    if strategy is PlacementStrategy.ROUND_ROBIN:
        assigned = [(p, i % num_ps) for i, p in enumerate(pieces)]
    else:
        assigned = _greedy(pieces, num_ps, request_cost_bytes)
    order = {p[1]: i for i, p in enumerate(pieces)}
    shards = tuple(sorted((ShardPlacement(v, n, ps, a, b, nb) for (v, n, a, b, nb), ps in assigned),
                          key=lambda s: order[s.name]))
    return Placement(shards, num_ps)


def _step_cost(loads: Sequence[int], used: Sequence[bool], request_cost: int) -> float:
    """What the greedy placement minimises, for per-ps shard bytes `loads` (`used`: the ps holds
    a shard): the busiest ps's load plus the mean load, a used ps counting `request_cost` more
    (it gets a request every step). The busiest ps bounds a step where every ps has a core of
    its own; the mean is the machine's work where tasks share the cores."""
    costs = [load + request_cost if holds else 0 for load, holds in zip(loads, used)]
    return max(costs) + sum(costs) / len(costs)


def _greedy(pieces, num_ps, request_cost: int):
    """Largest shard first, each to a ps not holding another shard of its variable (while there
    is one), in two ways: by bytes alone (to the least loaded ps, TF's greedy balancer), and by
    `_step_cost` (to the ps where it least raises it, so a small shard joins a ps already used
    rather than making every push a request longer: the softmax's bias travels with its weights,
    one request per step instead of two). The one of lower `_step_cost` wins (ties: the second
    way).
    Taking the better of both keeps many small variables from piling up on one ps, which the
    second alone would do."""
    by_bytes = _largest_first(pieces, num_ps, request_cost=0)
    by_cost = _largest_first(pieces, num_ps, request_cost=request_cost)
    return min((by_cost, by_bytes), key=lambda assigned: _cost_of(assigned, num_ps, request_cost))


def _largest_first(pieces, num_ps, *, request_cost: int):
    """Largest piece first, each to the ps where it least raises the busiest ps's load plus the
    mean load (a ps counting `request_cost` more once it holds a piece); among equals, the ps
    left with the least load, then the lowest index. With `request_cost` 0 this is the least
    loaded ps: by bytes alone."""
    load = [0] * num_ps
    holders: dict[str, set[int]] = {}
    assigned = []
    for piece in sorted(pieces, key=lambda p: -p[4]):
        taken = holders.setdefault(piece[0], set())
        candidates = [i for i in range(num_ps) if i not in taken] or list(range(num_ps))

        def after(i: int) -> list[int]:
            loads = list(load)
            loads[i] += piece[4] + (request_cost if not loads[i] else 0)
            return loads

        def cost(i: int) -> tuple[float, int, int]:
            loads = after(i)
            return (max(loads) + sum(loads) / num_ps, loads[i], i)

        ps = min(candidates, key=cost)
        load = after(ps)
        taken.add(ps)
        assigned.append((piece, ps))
    return assigned


def _cost_of(assigned, num_ps: int, request_cost: int) -> float:
    loads, used = [0] * num_ps, [False] * num_ps
    for piece, ps in assigned:
        loads[ps] += piece[4]
        used[ps] = True
    return _step_cost(loads, used, request_cost)
