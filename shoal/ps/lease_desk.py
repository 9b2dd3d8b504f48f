"""`LeaseDesk`: the lease service of a ps: ps 0 keeps the job's `LeaseBook` and serves `lease`;
pushes that carry `used` positions are checked for malformed positions before they are applied
and counted by their outcome after: a recoverable situation (a resent push, a member dropped
for a missed heartbeat and back, a ps 0 rebuilt without a book) never refuses a push. The part of PsService that knows about leases (docs/dynamic-sharding.md).

Runs on the ps's serving thread only; not thread-safe. No I/O but logging.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

from shoal.ps.errors import PsError
from shoal.ps.leases import EpochSummary, LeaseBook, LeaseError, Sorted
from shoal.ps.protocol import LeaseCounts, LeaseReply, LeaseRequest, LeaseState, PushOutcome, PushRequest

log = logging.getLogger("shoal.ps.service")

LEASE_SERVER = "ps:0"
"""The task that serves leases."""

EPOCH_LINE_EVERY_S = 10.0
"""Epochs that complete cleanly get an INFO line at most this often (a small model on a fast
machine completes several a second); the first, and one with positions requeued or lost, always."""


class LeaseDesk:
    """The lease book of ps `task_name` (a book only on ps 0; created by the first lease request,
    which declares the data set, or by a checkpoint's state at `init`). `book_id` tells this
    process's leases from an earlier ps 0's (pass the ps's incarnation)."""

    def __init__(self, task_name: str, book_id: str, clock: Callable[[], float] = time.monotonic):
        self.task_name = task_name
        self._clock = clock
        self._epoch_line_at: float | None = None  # when the last INFO epoch line was logged
        self._epochs_unsaid = 0  # clean epochs completed since then, said at DEBUG only
        self.serves = task_name == LEASE_SERVER
        self.book_id = book_id
        self.book: LeaseBook | None = None
        self._lost_before_book = 0  # positions applied pushes used while there was no book yet

    def lease(self, message: LeaseRequest) -> LeaseReply:
        """Answer a lease request. Raises PsError on a ps other than ps 0, for a data set other
        than the one declared, and LeaseError for a request the book refuses."""
        if not self.serves:
            raise PsError(f"{self.task_name} does not serve leases; ask {LEASE_SERVER} (the lease service of "
                          "dynamic data sharding runs on the first ps task)")
        book = self.book
        if book is None:
            book = self.book = LeaseBook(self.book_id, message.num_examples, message.seed)
            log.info("%s: lease service for %d examples (seed %d), declared by %s", self.task_name,
                     message.num_examples, message.seed, message.task)
        elif (book.num_examples, book.seed) != (message.num_examples, message.seed):
            raise LeaseError(f"{message.task} leases from a data set of {message.num_examples} examples with seed "
                             f"{message.seed}, but this job's is {book.num_examples} examples with seed {book.seed}; "
                             "every worker must pass the same num_examples and seed (a job restored from a "
                             "checkpoint keeps its data set: use a fresh model dir for another)")
        grant = book.lease(message.task, message.holder, message.count, message.until_epoch)
        if self._lost_before_book:  # on the epoch the first lease opened
            book.count_lost(self._lost_before_book)
            self._lost_before_book = 0
        if grant.released:
            log.info("%s: %s restarted; %d positions it held went back to the queue", self.task_name,
                     message.task, grant.released)
        lease = grant.lease
        if lease is None:
            return LeaseReply(grant.state, self.book_id, epoch=book.epoch, held_by=grant.held_by,
                              released=grant.released)
        return LeaseReply(LeaseState.GRANTED, self.book_id, lease.id, lease.epoch, lease.start, lease.end,
                          released=grant.released)

    def check_push(self, message: PushRequest) -> Sorted | None:
        """Before a push is applied: refuse malformed `used` positions (LeaseError: outside the
        data set, of a lease never issued or another task's, outside their lease, named twice).
        What is merely no longer leased is decided by `account`, once the outcome is known:
        pass it what this returns (the positions sorted; None when there is nothing to sort)."""
        if message.used is not None and self.serves and self.book is not None:
            return self.book.sort(message.task, message.used.book, message.used.ranges)
        return None

    def account(self, message: PushRequest, outcome: PushOutcome, sync_step: int | None,
                checked: Sorted | None = None) -> None:
        """After a push's outcome is known (checked by `check_push` before, which returned
        `checked`; without it the positions are sorted here). Fresh positions (leased, not
        reported yet): APPLIED in async mode -> consumed; APPLIED or ACCUMULATED in sync mode ->
        pending in `sync_step`; STALE, DUPLICATE or ROLLED_BACK -> back to the queue. Positions
        reported before by the same task (a resent push) are left as they are; those the book
        cannot place (another book's or no book's, or leases given back since) are lost if applied."""
        book, used = self.book, message.used
        if used is None or not self.serves:
            return
        dropped = outcome in (PushOutcome.STALE, PushOutcome.DUPLICATE, PushOutcome.ROLLED_BACK)
        if book is None:
            if not dropped:
                lost = sum(end - start for _, start, end in used.ranges)
                self._lost_before_book += lost
                log.warning("%s: %s used %d positions leased before this ps started, which has no lease book; "
                            "counted lost (they may be used again this epoch)", self.task_name, message.task, lost)
            return
        sorted_ = checked if checked is not None else book.sort(message.task, used.book, used.ranges)
        self._log_completed(book.count_push(message.task, sorted_, not dropped, sync_step))
        if sorted_.lost and not dropped:
            lost = sum(end - start for _, start, end in sorted_.lost)
            why = "leased before this ps started" if sorted_.foreign else "given back when it left or restarted"
            log.warning("%s: %s used %d positions %s; counted lost (they may be used again this epoch)",
                        self.task_name, message.task, lost, why)

    def step_reached(self, step: int) -> None:
        if self.book is not None:
            self._log_completed(self.book.step_reached(step))

    def step_abandoned(self, step: int) -> None:
        if self.book is not None:
            self.book.step_abandoned(step)

    def release(self, task: str, how: str = "left") -> None:
        """`task` left (`how`: "finished", or "left" otherwise): what it leased and did not use
        goes back to the queue. Idempotent."""
        if self.book is not None:
            back = self.book.release(task)
            if back:
                log.info("%s: %s %s; the %d positions it had leased but not used went back to the queue",
                         self.task_name, task, how, back)

    def export(self) -> dict[str, Any] | None:
        return self.book.export() if self.book is not None else None

    def load(self, state: Mapping[str, Any] | None) -> LeaseBook | None:
        """The book a checkpoint's state (`init`) makes, not installed yet: validate it before
        the ps changes anything. None for no state or a ps other than ps 0. Raises LeaseError."""
        if state is None or not self.serves:
            return None
        return LeaseBook.restore(self.book_id, state)

    def install(self, book: LeaseBook | None) -> None:
        """Keep `book` (from `load`); None keeps no book."""
        if book is None:
            return
        self.book = book
        c = book.counts()
        log.info("%s: restored the lease book: epoch %d, %d of %d positions consumed", self.task_name, c.epoch,
                 c.consumed, c.num_examples)

    def counts(self) -> LeaseCounts | None:
        return self.book.counts() if self.book is not None else None

    def _log_completed(self, summaries: list[EpochSummary]) -> None:
        for s in summaries:
            now = self._clock()
            clean = s.requeued == 0 and s.lost == 0
            if clean and self._epoch_line_at is not None and now - self._epoch_line_at < EPOCH_LINE_EVERY_S:
                self._epochs_unsaid += 1
                log.debug("%s: epoch %d complete: %d positions consumed exactly once, %d requeued, %d lost",
                          self.task_name, s.epoch, s.consumed, s.requeued, s.lost)
                continue
            more = (f" ({self._epochs_unsaid} more complete since the last line, each exactly once)"
                    if self._epochs_unsaid else "")
            log.info("%s: epoch %d complete: %d positions consumed exactly once, %d requeued, %d lost%s",
                     self.task_name, s.epoch, s.consumed, s.requeued, s.lost, more)
            self._epoch_line_at, self._epochs_unsaid = now, 0
