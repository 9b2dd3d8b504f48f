"""`LeaseBook`: which positions of the training set each epoch are free, leased, pending or consumed.

Dynamic data sharding (docs/dynamic-sharding.md). An epoch has positions 0..N-1; a worker maps a
position to an example through a permutation seeded by (seed, epoch) that it computes itself, so
only integers travel. The book hands out leases: ranges of up to `count` free positions, lowest
first, to a task. Each position of an epoch moves

    FREE --lease--> LEASED --consume--> CONSUMED                     (a gradient the ps applied)
                    LEASED --hold(step)--> PENDING --step_reached--> CONSUMED     (sync)
                                           PENDING --step_abandoned--> FREE       (requeued)
                    LEASED --requeue / release--> FREE                            (requeued)

(consume, hold and requeue by a push's outcome: `count_push`; release when a task left), and
an epoch is complete when all N are CONSUMED; a position is consumed at most once per epoch
(RangeSet refuses a second time: that would be a bug). The next epoch opens whenever no
open epoch has a FREE position left (every remaining one is leased or pending), so a request
never waits on positions merely held by others: workers are never idle in the tail of an epoch,
and a sync step never waits on a worker that has no data (its peers may hold whole leases they
have not used yet, and their pending positions wait for this very step). A lease is at most
ceil(N / sharers) positions (sharers: the tasks that leased and did not leave), so the positions
held out stay about one epoch in all and few epochs are open at once (a new one opens only when
every open one has positions held out). `max_open_epochs` (32) is a safety cap on memory, not a
schedule: a request waits only once that many are open (a task sitting on leases while the
others run through epochs) or at its `until_epoch`.

`sort` tells a push's positions apart: fresh (leased, not reported), reported before by the
same task (a resent push: nothing to count), and lost; `count_push` then counts them by the
push's outcome, with no second check (one check per push). `lose` counts positions a push used that
this book cannot place: their lease came from another book (ps 0 restarted since) or was given
back (the task was dropped for a missed heartbeat, or restarted) — their use was applied but is
not recorded as consumed, so the example may be used again this epoch. `export` / `restore` carry the open epochs' consumed
positions and the counters through a checkpoint; on restore every other position is FREE.

Pure logic: no I/O, no clock. Not thread-safe (the ps's serving thread owns it). Memory is
bounded by the number of outstanding ranges (at most `max_leases_per_task` open leases per task,
and as many used-up ones remembered), never by a request's numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from shoal.ps.errors import PsError
from shoal.ps.protocol import MAX_EXAMPLES, LeaseCounts, LeaseState
from shoal.ps.ranges import RangeSet

STATE_VERSION = 1
MAX_OPEN_EPOCHS = 32
"""How many epochs may be open at once (see the module docstring: a safety cap, not a schedule)."""
MAX_STATE_RANGES = 100_000
"""The most consumed ranges an exported state may hold (a checkpoint, a snapshot header)."""


class LeaseError(PsError):
    """A lease request or a push's `used` positions that the book cannot accept."""


@dataclass(frozen=True)
class Lease:
    """Positions [start, end) of `epoch`, leased to `task` as lease `id`."""

    id: int
    task: str
    epoch: int
    start: int
    end: int


@dataclass(frozen=True)
class Grant:
    """A lease request's answer: `lease` when GRANTED; `held_by` (tasks holding positions still
    out) when WAIT; `released` positions of the task's earlier holder given back first."""

    state: LeaseState
    lease: Lease | None = None
    held_by: tuple[str, ...] = ()
    released: int = 0


@dataclass(frozen=True)
class EpochSummary:
    """A completed epoch's counts (requeued may exceed N: a position can go back more than once)."""

    epoch: int
    consumed: int
    requeued: int
    lost: int


@dataclass(frozen=True)
class Sorted:
    """A push's `used` positions as this book can count them (`LeaseBook.sort`): `fresh` ones
    are leased and not yet reported (`count_push` consumes, holds or requeues them); positions
    reported by the same task before (a resent push) are in neither list: nothing to do; `lost`
    ones cannot be placed: leases of this book given back (the task left or restarted since) or
    of another book (ps 0 restarted since)."""

    fresh: tuple[tuple[int, int, int], ...]
    lost: tuple[tuple[int, int, int], ...]
    foreign: bool


@dataclass
class _Epoch:
    index: int
    free: RangeSet
    consumed: RangeSet
    requeued: int = 0
    lost: int = 0


@dataclass
class _OpenLease:
    lease: Lease
    holder: str
    outstanding: RangeSet  # not yet reported in a push


@dataclass
class _Pending:
    step: int
    epoch: int
    start: int
    end: int


@dataclass
class _TaskLeases:
    holder: str
    ids: list[int] = field(default_factory=list)


class LeaseBook:
    """The lease book of one data set of `num_examples` examples shuffled from `seed`, named
    `book_id` (ps 0's incarnation, so a lease from an earlier ps 0 process is told apart).
    See the module docstring for the states; not thread-safe."""

    def __init__(self, book_id: str, num_examples: int, seed: int, *, max_open_epochs: int = MAX_OPEN_EPOCHS,
                 max_leases_per_task: int = 64):
        if not (isinstance(num_examples, int) and not isinstance(num_examples, bool) and 1 <= num_examples <= MAX_EXAMPLES):
            raise LeaseError(f"num_examples must be an int from 1 to {MAX_EXAMPLES}, got {num_examples!r}")
        if not (isinstance(seed, int) and seed >= 0):
            raise LeaseError(f"seed must be an int >= 0, got {seed!r}")
        if max_open_epochs < 1 or max_leases_per_task < 1:
            raise LeaseError(f"max_open_epochs ({max_open_epochs}) and max_leases_per_task ({max_leases_per_task}) "
                             "must be >= 1")
        self.book_id = book_id
        self.num_examples = num_examples
        self.seed = seed
        self.max_open_epochs = max_open_epochs
        self.max_leases_per_task = max_leases_per_task
        self._open: dict[int, _Epoch] = {}  # epoch index -> its state, oldest first
        self._next_epoch = 0
        self._leases: dict[int, _OpenLease] = {}
        self._tasks: dict[str, _TaskLeases] = {}
        self._sharers: set[str] = set()  # tasks that leased and did not leave: a lease is at most N / len
        self._pending: list[_Pending] = []
        self._closed: dict[int, Lease] = {}  # leases all reported, the latest per task: a resent push names them
        self._closed_of: dict[str, deque[int]] = {}
        self._next_lease = 1
        self._completed = 0
        self._requeued_total = 0
        self._lost_total = 0

    # --- reading ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The oldest epoch not yet complete (the next to open when none is open)."""
        return min(self._open, default=self._next_epoch)

    @property
    def completed(self) -> int:
        """How many epochs were completed (all positions consumed)."""
        return self._completed

    def counts(self) -> LeaseCounts:
        """The counts of the oldest epoch not yet complete."""
        e = self._open.get(self.epoch)
        leased = sum(o.outstanding.total for o in self._leases.values() if o.lease.epoch == self.epoch)
        pending = sum(p.end - p.start for p in self._pending if p.epoch == self.epoch)
        return LeaseCounts(self.num_examples, self.epoch, e.consumed.total if e else 0, leased, pending,
                           e.requeued if e else 0, e.lost if e else 0, self._completed)

    def leases_of(self, task: str) -> tuple[Lease, ...]:
        held = self._tasks.get(task)
        return tuple(self._leases[i].lease for i in held.ids) if held else ()

    # --- transitions -----------------------------------------------------------------------

    def lease(self, task: str, holder: str, count: int, until_epoch: int | None = None) -> Grant:
        """Lease up to `count` free positions to `task`, at most ceil(N / sharers) (the lowest free
        ones of the oldest open epoch before `until_epoch`, opening the next epoch when none is
        free and fewer than `max_open_epochs` are open). A `holder` other
        than the one of the task's open leases means the task was restarted: those are released
        first. Raises LeaseError for a bad count or a task over its lease limit."""
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise LeaseError(f"{task} asked for {count!r} positions; ask for an int >= 1")
        released = 0
        held = self._tasks.get(task)
        if held is not None and held.holder != holder:
            released = self.release(task)
            held = None
        if held is not None and len(held.ids) >= self.max_leases_per_task:
            raise LeaseError(f"{task} already holds {len(held.ids)} leases (the most a task may hold); push the "
                             "positions it holds (`used=`) before leasing more")
        limit = until_epoch if until_epoch is not None else float("inf")
        epoch = next((e for i, e in self._open.items() if i < limit and e.free.total), None)
        if epoch is None and len(self._open) < self.max_open_epochs and self._next_epoch < limit:
            epoch = self._open[self._next_epoch] = _Epoch(self._next_epoch, RangeSet([(0, self.num_examples)]),
                                                          RangeSet())
            self._next_epoch += 1
        if epoch is None:
            if any(i < limit for i in self._open):
                return Grant(LeaseState.WAIT, held_by=self._holders_before(limit), released=released)
            return Grant(LeaseState.EXHAUSTED, released=released)
        self._sharers.add(task)
        start, end = epoch.free.take_first(min(count, -(-self.num_examples // len(self._sharers))))
        lease = Lease(self._next_lease, task, epoch.index, start, end)
        self._next_lease += 1
        self._leases[lease.id] = _OpenLease(lease, holder, RangeSet([(start, end)]))
        self._tasks.setdefault(task, _TaskLeases(holder)).ids.append(lease.id)
        return Grant(LeaseState.GRANTED, lease, released=released)

    def sort(self, task: str, book: str, ranges: Iterable[tuple[int, int, int]]) -> Sorted:
        """Sort the `used` positions of `task`'s push (see `Sorted`); changes nothing. Raises
        LeaseError for malformed ones only: outside the data set, of a lease this book never
        issued, of another task's lease, outside their lease, or named twice in one push."""
        ranges = self._in_bounds(task, ranges)
        if book != self.book_id:
            return Sorted((), tuple(ranges), True)
        fresh: list[tuple[int, int, int]] = []
        lost: list[tuple[int, int, int]] = []
        seen: dict[int, RangeSet] = {}
        for lease_id, start, end in ranges:
            if not 1 <= lease_id < self._next_lease:
                raise LeaseError(f"{task} reported positions of lease {lease_id}, which was never issued by this "
                                 "ps (the leases of ps 0 are numbered from 1 in the order it issued them)")
            open_lease = self._leases.get(lease_id)
            lease = open_lease.lease if open_lease is not None else self._closed.get(lease_id)
            if lease is not None:
                _require_owner(task, lease_id, lease)
            if lease is not None and not lease.start <= start < end <= lease.end:
                raise LeaseError(f"{task} reported positions [{start}, {end}) of lease {lease_id} (epoch "
                                 f"{lease.epoch}, [{lease.start}, {lease.end})), but they are outside it")
            if len(ranges) > 1:  # (one range cannot name a position twice)
                mine = seen.setdefault(lease_id, RangeSet())
                if mine.overlaps(start, end):
                    raise LeaseError(f"{task} reported positions [{start}, {end}) of lease {lease_id} twice in one "
                                     "push")
                mine.add(start, end)
            if lease is None:
                lost.append((lease_id, start, end))  # given back when the task left or restarted
                continue
            for s, t in (open_lease.outstanding if open_lease is not None else ()):
                s, t = max(s, start), min(t, end)
                if s < t:
                    fresh.append((lease_id, s, t))
        return Sorted(tuple(fresh), tuple(lost), False)

    def count_push(self, task: str, used: Sorted, applied: bool, sync_step: int | None) -> list[EpochSummary]:
        """Count `task`'s push's positions as `sort` sorted them (for this push, just now: no
        second check). Fresh ones: not `applied` -> back to the queue (requeue); applied in
        async mode (`sync_step` None) -> consumed; in sync mode -> pending in `sync_step`
        (hold). Lost ones, if applied, are counted lost. Returns the epochs this completed."""
        if not applied:
            self._requeue(self._take(task, used.fresh))
            return []
        completed = self._consume(self._take(task, used.fresh)) if sync_step is None else []
        if sync_step is not None:
            self._hold(self._take(task, used.fresh), sync_step)
        if used.lost:
            self.lose(used.lost)
        return completed

    def lose(self, ranges: Iterable[tuple[int, int, int]]) -> int:
        """Count positions a push used that this book cannot place (another book's, or leases
        given back since) as lost (on the oldest open epoch). Returns how many."""
        lost = sum(end - start for _, start, end in ranges)
        self.count_lost(lost)
        return lost

    def count_lost(self, lost: int) -> None:
        """Count `lost` positions as lost (on the oldest open epoch)."""
        epoch = self._open.get(self.epoch)
        if epoch is not None:
            epoch.lost += lost
        self._lost_total += lost

    def step_reached(self, step: int) -> list[EpochSummary]:
        """The ps reached sync step `step`: PENDING of earlier steps -> CONSUMED. Returns the
        epochs this completed."""
        still = []
        for p in self._pending:
            if p.step < step:
                self._open[p.epoch].consumed.add(p.start, p.end)
            else:
                still.append(p)
        if len(still) == len(self._pending):
            return []
        self._pending = still
        return self._close_complete()

    def step_abandoned(self, step: int) -> int:
        """Sync step `step` was given up: its PENDING -> FREE. Returns how many positions."""
        back = [p for p in self._pending if p.step >= step]
        self._pending = [p for p in self._pending if p.step < step]
        for p in back:
            self._free(p.epoch, p.start, p.end)
        return sum(p.end - p.start for p in back)

    def release(self, task: str) -> int:
        """`task` left (done, failed, expired, restarted): the positions of its leases it did not
        report go back to the queue (PENDING ones stay with their step). Returns how many. Idempotent."""
        held = self._tasks.pop(task, None)
        self._sharers.discard(task)
        for lease_id in self._closed_of.pop(task, ()):
            del self._closed[lease_id]
        back = 0
        for lease_id in held.ids if held else ():
            open_lease = self._leases.pop(lease_id)
            for start, end in open_lease.outstanding:
                self._free(open_lease.lease.epoch, start, end)
                back += end - start
        return back

    # --- checkpoints -----------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The state a checkpoint keeps: the data set, the open epochs' consumed ranges and the
        counters. Leased and pending positions are not in it: restored, they are FREE."""
        ranges = sum(len(e.consumed) for e in self._open.values())
        if ranges > MAX_STATE_RANGES:
            raise LeaseError(f"the lease book's consumed positions are split into {ranges} ranges, more than a "
                             f"checkpoint holds ({MAX_STATE_RANGES}); use larger leases (lease_size)")
        return {"version": STATE_VERSION, "num_examples": self.num_examples, "seed": self.seed,
                "next_epoch": self._next_epoch, "completed": self._completed,
                "requeued": self._requeued_total, "lost": self._lost_total,
                "epochs": [{"epoch": e.index, "consumed": [[s, t] for s, t in e.consumed],
                            "requeued": e.requeued, "lost": e.lost} for e in self._open.values()]}

    @classmethod
    def restore(cls, book_id: str, state: Mapping[str, Any], **limits: int) -> "LeaseBook":
        """A book in the state `export` returned (from a checkpoint). Raises LeaseError naming
        the first bad value."""
        def count(where: Mapping, key: str, maximum: int | float = float("inf")) -> int:
            value = where.get(key) if isinstance(where, Mapping) else None
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum):
                raise LeaseError(f"lease state: {key!r} must be an int from 0 to {maximum}, got {value!r:.60}; "
                                 "is the checkpoint damaged?")
            return value

        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise LeaseError(f"lease state: version must be {STATE_VERSION}, got "
                             f"{state.get('version') if isinstance(state, Mapping) else state!r:.60}; was it written "
                             "by a newer Shoal?")
        book = cls(book_id, count(state, "num_examples", MAX_EXAMPLES), count(state, "seed"), **limits)
        book._next_epoch = count(state, "next_epoch")
        book._completed = count(state, "completed")
        book._requeued_total, book._lost_total = count(state, "requeued"), count(state, "lost")
        epochs = state.get("epochs")
        if not isinstance(epochs, list) or len(epochs) > book.max_open_epochs:
            raise LeaseError(f"lease state: 'epochs' must be a list of at most {book.max_open_epochs} open epochs, "
                             f"got {epochs!r:.60}")
        total = 0
        for entry in epochs:
            index = count(entry, "epoch", book._next_epoch - 1)
            consumed = entry.get("consumed")
            if index in book._open or not isinstance(consumed, list):
                raise LeaseError(f"lease state: epoch {index} is listed twice or has no 'consumed' list")
            total += len(consumed)
            if total > MAX_STATE_RANGES:
                raise LeaseError(f"lease state: more than {MAX_STATE_RANGES} consumed ranges")
            done, last = RangeSet(), -1
            for r in consumed:
                if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                    for x in r)
                        and last < r[0] < r[1] <= book.num_examples):
                    raise LeaseError(f"lease state: epoch {index} has a bad consumed range {r!r:.60} (ranges are "
                                     f"sorted, disjoint [start, end) within 0..{book.num_examples})")
                done.add(r[0], r[1])
                last = r[1]
            free = RangeSet([(0, book.num_examples)])
            for s, t in done:
                free.remove(s, t)
            book._open[index] = _Epoch(index, free, done, count(entry, "requeued"), count(entry, "lost"))
        book._open = dict(sorted(book._open.items()))
        book._close_complete()
        return book

    # --- internals -------------------------------------------------------------------------

    def _in_bounds(self, task: str, ranges: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """`ranges` as a list; LeaseError for one outside the data set."""
        ranges = [tuple(r) for r in ranges]
        for lease_id, start, end in ranges:
            if not 0 <= start < end <= self.num_examples:
                raise LeaseError(f"{task} reported positions [{start}, {end}) of lease {lease_id}; positions must "
                                 f"satisfy 0 <= start < end <= {self.num_examples} (the data set's size)")
        return ranges

    def _consume(self, taken: list[tuple[_OpenLease, int, int]]) -> list[EpochSummary]:
        for open_lease, start, end in taken:
            self._open[open_lease.lease.epoch].consumed.add(start, end)
        return self._close_complete()

    def _hold(self, taken: list[tuple[_OpenLease, int, int]], step: int) -> None:
        for open_lease, start, end in taken:
            self._pending.append(_Pending(step, open_lease.lease.epoch, start, end))

    def _requeue(self, taken: list[tuple[_OpenLease, int, int]]) -> None:
        for open_lease, start, end in taken:
            self._free(open_lease.lease.epoch, start, end)

    def _take(self, task: str, ranges: Iterable[tuple[int, int, int]]) -> list[tuple[_OpenLease, int, int]]:
        """Take `ranges` (checked already: outstanding positions of `task`'s open leases, no two
        overlapping) out of their leases' outstanding positions; a lease with none left is closed."""
        taken = []
        for lease_id, start, end in ranges:
            open_lease = self._leases[lease_id]
            open_lease.outstanding.remove(start, end)
            taken.append((open_lease, start, end))
            if not len(open_lease.outstanding):
                del self._leases[lease_id]
                self._remember_closed(open_lease.lease)
                held = self._tasks[task]
                held.ids.remove(lease_id)
                if not held.ids:
                    del self._tasks[task]
        return taken

    def _remember_closed(self, lease: Lease) -> None:
        """Keep the latest `max_leases_per_task` used-up leases of a task: a resent push names them."""
        ids = self._closed_of.setdefault(lease.task, deque())
        ids.append(lease.id)
        self._closed[lease.id] = lease
        if len(ids) > self.max_leases_per_task:
            del self._closed[ids.popleft()]

    def _free(self, epoch: int, start: int, end: int) -> None:
        e = self._open[epoch]
        e.free.add(start, end)
        e.requeued += end - start
        self._requeued_total += end - start

    def _close_complete(self) -> list[EpochSummary]:
        closed = []
        for index, e in list(self._open.items()):
            if e.consumed.total == self.num_examples:
                del self._open[index]
                self._completed += 1
                closed.append(EpochSummary(index, e.consumed.total, e.requeued, e.lost))
        return closed

    def _holders_before(self, limit: float) -> tuple[str, ...]:
        tasks = {o.lease.task for o in self._leases.values() if o.lease.epoch < limit}
        if any(p.epoch < limit for p in self._pending):
            tasks.add("(a sync step not yet applied)")
        return tuple(sorted(tasks))


def _require_owner(task: str, lease_id: int, lease: Lease) -> None:
    if lease.task != task:
        raise LeaseError(f"{task} reported positions of lease {lease_id}, which is leased to {lease.task}")
