"""How many bytes of a push travel in one message (`push_part_bytes`), when the caller does not say.

A push goes in parts so that a ps updates and answers one part while the next is on its way
(the upload of part k+1 overlaps the download of part k). That pays on a link that is slow next
to what a request costs the two processes: at 1 Gbit/s a 256 KiB part is ~2 ms on the wire, and
parts of that size made the MLP example 1.26x faster (bench.multihost_throughput). On loopback a
256 KiB part moves in ~0.1 ms while its request costs both processes 0.25-0.55 ms of CPU beyond
its bytes (header, dispatch, reply, zmq frames and thread wake-ups; bench/README.md, "ps_bandwidth,
issue 16, part size"), so a push was about as many times slower as it had parts. There, parts of
one wire chunk (4 MiB) still overlap a large push's update with its transfer, at a 16th of the
requests.

The part size also bounds a shard (`place_variables` cuts variables at it), and shards move
whole when a ps is re-homed or joins: on loopback, with 4 MiB shards, a ps added to a job of
small variables may get little or nothing (pass a smaller `push_part_bytes` to cut finer).

Every task of a job computes the placement itself, so the choice depends only on what every
task sees alike: the ps addresses of the cluster spec. Pure; thread-safe.
"""

from __future__ import annotations

import enum
from typing import Sequence

from shoal.train.placement import DEFAULT_PUSH_PART_BYTES
from shoal.wire import CHUNK_BYTES
from shoal.wire.endpoint import all_loopback

LINK_PART_BYTES = DEFAULT_PUSH_PART_BYTES
"""Parts when any ps is on another host (or named by a name that is not a loopback one)."""
LOOPBACK_PART_BYTES = CHUNK_BYTES
"""Parts when every ps is on this machine's loopback: one wire chunk (a single frame) each."""


class PartSize(enum.Enum):
    """The part size a session picks for itself: AUTO (`part_bytes_for` decides)."""

    AUTO = "auto"


def part_bytes_for(requested: int | None | PartSize, ps_addresses: Sequence[str]) -> int | None:
    """The part size to place and push with: `requested` as given (bytes, or None for one
    message per ps), or for AUTO, LOOPBACK_PART_BYTES when every address in `ps_addresses` is a
    loopback one and LINK_PART_BYTES otherwise. Decided on the addresses' text (no lookups), so
    every task of the job decides the same."""
    if requested is not PartSize.AUTO:
        return requested
    if all_loopback(ps_addresses):
        return LOOPBACK_PART_BYTES
    return LINK_PART_BYTES
