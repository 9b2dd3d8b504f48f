"""Dynamic data sharding, worker side: batches of example indices leased from ps 0.

    batches = session.leased_batches(len(train_y), batch_size=100)
    for batch in batches:                       # ends after `epochs` epochs (None: never)
        loss, result = session.run_step(loss_and_grad, x[batch.indices], y[batch.indices], used=batch)

Ps 0 hands out ranges of positions 0..N-1 of the current epoch (leases); a position p of epoch
e is example `epoch_permutation(N, seed, e)[p]`, computed here, so only integers travel. A push
with `used=batch` tells ps 0 which positions its gradient used: ps 0 counts each position of an
epoch once, as consumed by an applied gradient, and gives the positions of a worker that left
to the others. See docs/dynamic-sharding.md for what is guaranteed.

Not thread-safe: use it on the thread that owns the session (it talks through the session's
PsClient). Each lease request blocks on ps 0.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from shoal.ps.client import PsClient
from shoal.ps.protocol import MAX_USED_RANGES, LeaseRequest, LeaseState, UsedPositions
from shoal.train.errors import TrainError
from shoal.train.waiting import LOG_EVERY_S

log = logging.getLogger(__name__)

DEFAULT_LEASE_BATCHES = 32
"""Batches per lease request by default, on a data set large enough (`default_lease_size`). A
lease is one round trip to ps 0 that the step waits for; at 8 batches the softmax's worker spent
14.5 us of its 255 us step on it, and 32 made the 2 ps + 2 workers softmax 5-19% faster
(bench/README.md, "Larger leases")."""

MIN_LEASES_PER_EPOCH = 16
"""By default a lease holds at most this fraction of an epoch: ps 0 caps a lease at N / the
workers leasing so far, which is all of N for the first worker to ask, and a small data set
must not go to it whole."""


def default_lease_size(num_examples: int, batch_size: int, positions: int | None = None) -> int:
    """Positions per lease request when none is given: DEFAULT_LEASE_BATCHES batches (or
    `positions`), at most a MIN_LEASES_PER_EPOCH-th of the data set, at least one batch. A
    larger lease makes the tail of the last epoch longer (a worker still holding positions while
    the others finish), and after ps 0 restarts, the positions the workers held are leased again
    (used twice in that epoch); a worker that leaves gives its leases back either way."""
    wanted = DEFAULT_LEASE_BATCHES * batch_size if positions is None else positions
    return max(batch_size, min(wanted, num_examples // MIN_LEASES_PER_EPOCH))


class LeaseWaitError(TrainError):
    """No position was free for longer than the wait allows (the tasks holding them are named)."""


def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The example at each position of `epoch`: the same on every task and every run."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


@dataclass(frozen=True)
class LeasedBatch:
    """A batch of example `indices` and the leased positions they are (`used`: pass the batch
    as `session.push(grads, used=batch)`). `epoch` is the epoch of its first position."""

    indices: np.ndarray
    used: UsedPositions
    epoch: int

    def __len__(self) -> int:
        return len(self.indices)

    def part(self, lo: int, hi: int) -> "LeasedBatch":
        """Examples lo..hi-1 of this batch, with the positions they are (a sampler that hands a
        lease out one example at a time reports a step's share of it)."""
        ranges, offset = [], 0
        for lease, start, end in self.used.ranges:
            a, b = max(lo - offset, 0), min(hi - offset, end - start)
            if a < b:
                ranges.append((lease, start + a, start + b))
            offset += end - start
        return LeasedBatch(self.indices[lo:hi], UsedPositions(self.used.book, tuple(ranges)), self.epoch)


def merge_used(batches: Iterable[LeasedBatch]) -> UsedPositions | None:
    """The positions of several batches as one `used` (adjacent ranges of a lease joined); None
    for no batch. Positions of an earlier lease book (ps 0 restarted in between) are dropped:
    that book is gone."""
    batches = list(batches)
    if not batches:
        return None
    book = batches[-1].used.book
    ranges: list[list[int]] = []
    for lease, start, end in (r for b in batches if b.used.book == book for r in b.used.ranges):
        if ranges and ranges[-1][0] == lease and ranges[-1][2] == start:
            ranges[-1][2] = end
        else:
            ranges.append([lease, start, end])
    if len(ranges) > MAX_USED_RANGES:
        raise TrainError(f"one step used {len(ranges)} separate ranges of leased positions, more than a push "
                         f"carries ({MAX_USED_RANGES}); use larger leases (lease_size)")
    return UsedPositions(book, tuple(tuple(r) for r in ranges))


@dataclass
class _Held:
    book: str
    lease: int
    epoch: int
    start: int
    end: int


class LeasedBatches:
    """An iterator of `LeasedBatch`es of up to `batch_size` examples of a data set of
    `num_examples`, leased from ps 0 through `client` for `task` (`holder`: random per process,
    so ps 0 tells a restarted worker from the one before), `lease_size` positions per lease
    request (default `default_lease_size`: 32 batches, at most a 16th of the data set). The
    data set (`num_examples`, `seed`) must be the same on every worker. With `epochs`,
    iteration ends once epochs 0..epochs-1 are consumed by the job (a batch may be smaller at
    the very end); a job restored in epoch k continues it. A batch is
    smaller than `batch_size` only at that end or when no position is free (ps 0 opens the next
    epoch while others hold the rest, so that is the end of the epochs asked for, or the book's
    cap of open epochs): a wait with positions in hand could hold up the very push the others
    wait for. With `epochs`, iteration also ends when no position is free and every one still
    out is this task's own (batches taken but not pushed: nothing can come back to wait for);
    without, that raises LeaseWaitError at once. With no free position and none in hand, it
    waits (asking again every `poll_s`) up to `wait_timeout_s`, then raises LeaseWaitError
    naming the holders. With `idle_step` (the session gives it in sync training, where a step
    may wait for this worker) it calls `idle_step()` instead of each pause: the worker takes
    part in the others' steps with no data until positions come back or the epochs are
    consumed, and the wait's clock restarts after each such step. `shuffle=False` gives the
    positions themselves as indices. Blocks on ps 0; not thread-safe.
    """

    def __init__(self, client: PsClient, task: str, holder: str, num_examples: int, batch_size: int, *,
                 seed: int = 0, lease_size: int | None = None, epochs: int | None = None, shuffle: bool = True,
                 wait_timeout_s: float = 300.0, poll_s: float = 0.2, idle_step: Callable[[], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        if not (isinstance(num_examples, int) and num_examples >= 1):
            raise TrainError(f"num_examples must be an int >= 1, got {num_examples!r}")
        if not (isinstance(batch_size, int) and 1 <= batch_size):
            raise TrainError(f"batch_size must be an int >= 1, got {batch_size!r}")
        lease_size = lease_size if lease_size is not None else default_lease_size(num_examples, batch_size)
        if not (isinstance(lease_size, int) and lease_size >= 1):
            raise TrainError(f"lease_size must be an int >= 1, got {lease_size!r}")
        if epochs is not None and not (isinstance(epochs, int) and epochs >= 1):
            raise TrainError(f"epochs must be None (no end) or an int >= 1, got {epochs!r}")
        self._client = client
        self._request = LeaseRequest(task, holder, num_examples, seed, lease_size, epochs)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.wait_timeout_s = wait_timeout_s
        self.poll_s = poll_s
        self._idle_step = idle_step
        self._sleep, self._clock = sleep, clock
        self._held: deque[_Held] = deque()
        self._orders: dict[int, np.ndarray] = {}
        self._exhausted = False
        self.epoch = None
        """The epoch of the last batch (None before the first)."""

    def __iter__(self) -> "LeasedBatches":
        return self

    def __next__(self) -> LeasedBatch:
        batch = self.take(self.batch_size)
        if batch is None:
            raise StopIteration
        return batch

    def take(self, count: int, in_hand: int = 0) -> LeasedBatch | None:
        """Up to `count` positions as a batch; None once the epochs asked for are consumed. Blocks.
        `in_hand`: positions taken before for the same push and not pushed yet (a sampler that
        takes one at a time): with those or with part of this batch in hand, no position free
        means a short batch (or None) rather than a wait that the push may be holding up."""
        parts: list[_Held] = []
        have = 0
        while have < count and len(parts) < MAX_USED_RANGES:
            if not self._held and not self._lease(waiting_with=have + in_hand):
                break
            head = self._held[0]
            if parts and head.book != parts[0].book:
                break  # ps 0 restarted: a batch names the positions of one lease book
            k = min(count - have, head.end - head.start)
            parts.append(_Held(head.book, head.lease, head.epoch, head.start, head.start + k))
            head.start += k
            have += k
            if head.start == head.end:
                self._held.popleft()
        if not parts:
            return None
        if len(parts) == 1:  # the usual batch: one range of one lease (a copy, so the order stays intact)
            p = parts[0]
            indices = self._order(p.epoch)[p.start:p.end].copy()
            used = UsedPositions(p.book, ((p.lease, p.start, p.end),))
        else:
            indices = np.concatenate([self._order(p.epoch)[p.start:p.end] for p in parts])
            used = merge_used([LeasedBatch(indices, UsedPositions(p.book, ((p.lease, p.start, p.end),)), p.epoch)
                               for p in parts])
        self.epoch = parts[0].epoch
        return LeasedBatch(indices, used, parts[0].epoch)

    def take_lease(self, in_hand: int = 0) -> LeasedBatch | None:
        """The rest of the positions held now, as one batch: a lease, leased first if none is
        held (as `take` does, with the same rules for `in_hand`); None once the epochs asked for
        are consumed, or when none is free and positions are in hand. Blocks. For a sampler that
        hands positions out one at a time: one call per lease, not per example."""
        if not self._held and not self._lease(waiting_with=in_hand):
            return None
        head = self._held[0]
        return self.take(head.end - head.start, in_hand)

    def _lease(self, waiting_with: int) -> bool:
        """Lease more positions into `_held`. False when there are none to wait for: every epoch
        asked for is consumed, or `waiting_with` positions are in hand and none is free now."""
        if self._exhausted:
            return False
        deadline, logged = self._clock() + self.wait_timeout_s, self._clock()
        idle_steps = 0
        while True:
            reply = self._client.lease(self._request)
            if reply.state is LeaseState.GRANTED:
                self._held.append(_Held(reply.book, reply.lease, reply.epoch, reply.start, reply.end))
                return True
            if reply.state is LeaseState.EXHAUSTED:
                self._exhausted = True
                return False
            if waiting_with:
                return False  # a short batch now: waiting might hold up the push of what is in hand
            if reply.held_by == (self._request.task,):
                if self._request.until_epoch is not None:
                    return False  # the end: what is still out is in this worker's hands (not yet pushed)
                raise LeaseWaitError(f"{self._request.task} found no free position in the open epochs (from epoch "
                                     f"{reply.epoch}): every one still out is held by {self._request.task} itself "
                                     "(batches taken but not pushed with used=); push each batch before taking "
                                     "many more")
            now = self._clock()
            holders = ", ".join(reply.held_by) or "nobody"
            if now >= deadline:
                raise LeaseWaitError(f"{self._request.task} found no free position of epoch {reply.epoch} for "
                                     f"{self.wait_timeout_s:.0f}s; the rest are held by {holders}. Is it running? "
                                     "(a worker that left gives its positions back)")
            if self._idle_step is not None:
                if idle_steps == 0:
                    log.info("%s: no data position free in epoch %d (the rest are held by %s); it takes part in "
                             "the sync steps with no data until some come back or the epoch is consumed",
                             self._request.task, reply.epoch, holders)
                self._idle_step()  # the others' step goes on; then ask again
                idle_steps += 1
                deadline = self._clock() + self.wait_timeout_s
                continue
            if now - logged >= LOG_EVERY_S:
                log.info("%s: waiting for data positions; the rest of epoch %d are held by %s",
                         self._request.task, reply.epoch, holders)
                logged = now
            self._sleep(self.poll_s)

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            n = self._request.num_examples
            order = epoch_permutation(n, self._request.seed, epoch) if self.shuffle else np.arange(n)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return order
