"""What the placement weighs a ps's bytes against, by where the ps are: when to cut a variable
across ps (`min_shard_bytes`) and what one more request per step costs (`request_cost_bytes`).

Across hosts a byte costs link time: 64 KiB is ~0.5 ms of a 1 Gbit/s link, more than a request's
fixed CPU, so the placement spreads the bytes over the ps (a variable of 512 KiB or more is cut
into shards of at least 256 KiB, at most one per ps) and a request counts as 64 KiB. On one
machine a byte costs copies and the update, and a request ~115 us of CPU (worker and ps: header,
dispatch, reply, wake-ups; bench/README.md) — about what a megabyte costs. There a ps of its own
for each part of the MLP's 0.8 MB first layer doubled its requests for no gain: with the whole
model on ps 0 the 2 ps + 2 workers MLP ran 1.11-1.15x faster, medians by mode (bench/README.md,
"One request per step on one machine"). So when every ps is on loopback, a request counts as
LOOPBACK_REQUEST_COST_BYTES and a variable is cut across ps only from 2 x
LOOPBACK_MIN_SHARD_BYTES: a model of a few megabytes sits on one ps, a larger one spreads as
before. `--ps_placement round_robin` spreads it anyway.

Every task of a job computes the placement itself, so the choice depends only on what every
task sees alike: the ps addresses of the cluster spec (as `part_bytes_for` does). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shoal.train.placement import DEFAULT_MIN_SHARD_BYTES, REQUEST_COST_BYTES
from shoal.wire.endpoint import all_loopback

LOOPBACK_MIN_SHARD_BYTES = 1 << 20
LOOPBACK_REQUEST_COST_BYTES = 1 << 20


@dataclass(frozen=True)
class ShardCosts:
    min_shard_bytes: int
    request_cost_bytes: int


def shard_costs_for(min_shard_bytes: int | None, ps_addresses: Sequence[str]) -> ShardCosts:
    """The costs to place with: `min_shard_bytes` as given (None: by where the ps are), and a
    request's cost by where the ps are: the loopback ones when every address in `ps_addresses`
    is a loopback one, else the defaults. Decided on the addresses' text (no lookups), so every
    task of the job decides the same."""
    local = all_loopback(ps_addresses)
    if min_shard_bytes is None:
        min_shard_bytes = LOOPBACK_MIN_SHARD_BYTES if local else DEFAULT_MIN_SHARD_BYTES
    return ShardCosts(min_shard_bytes, LOOPBACK_REQUEST_COST_BYTES if local else REQUEST_COST_BYTES)
