"""The lease book of dynamic data sharding: every transition of a position, bad input, checkpoints.

The oracle: after any sequence of leases and reports, every position of an epoch is in exactly
one of free / leased / pending / consumed (checked by `assert_partition`)."""

import random

import pytest

from shoal.ps.leases import LeaseBook, LeaseError
from shoal.ps.protocol import LeaseState
from shoal.ps.ranges import RangeSet

N = 100


def book(n=N, **limits):
    return LeaseBook("book-a", n, 7, **limits)


def grant(b, task="worker:0", count=10, holder="h0", until=None):
    g = b.lease(task, holder, count, until)
    assert g.state is LeaseState.GRANTED, g
    return g.lease


def use(lease, start=None, end=None):
    return [(lease.id, lease.start if start is None else start, lease.end if end is None else end)]


def report(b, task, ranges, applied=True, step=None):
    """`task`'s push used `ranges`, counted as ps 0 counts a push (LeaseDesk: `sort`, then
    `count_push` by its outcome). Returns the epochs it completed."""
    return b.count_push(task, b.sort(task, b.book_id, ranges), applied, step)


def consume(b, task, ranges):
    """LEASED -> CONSUMED: an async gradient applied."""
    return report(b, task, ranges)


def hold(b, task, ranges, step):
    """LEASED -> PENDING: a gradient counted in sync step `step`."""
    report(b, task, ranges, step=step)


def requeue(b, task, ranges):
    """LEASED -> FREE: the gradient was dropped (stale, duplicate)."""
    report(b, task, ranges, applied=False)


def assert_partition(b, epoch):
    """Every position of `epoch` is in exactly one state, and the counts add up to N."""
    e = b._open[epoch]
    parts = [list(e.free), list(e.consumed)]
    parts += [list(o.outstanding) for o in b._leases.values() if o.lease.epoch == epoch]
    parts += [[(p.start, p.end)] for p in b._pending if p.epoch == epoch]
    union = RangeSet()
    for ranges in parts:
        for s, t in ranges:
            union.add(s, t)  # raises on overlap: a position in two states
    assert list(union) == [(0, b.num_examples)]


# --- RangeSet ---------------------------------------------------------------------------------

def test_rangeset_merges_adjacent_and_splits_on_remove():
    r = RangeSet([(0, 5), (10, 15)])
    r.add(5, 10)
    assert list(r) == [(0, 15)] and r.total == 15
    r.remove(3, 7)
    assert list(r) == [(0, 3), (7, 15)]
    assert r.covers(7, 15) and not r.covers(2, 8) and r.overlaps(2, 8) and not r.overlaps(3, 7)
    assert r.take_first(2) == (0, 2) and r.take_first(5) == (2, 3)


def test_rangeset_refuses_overlap_and_removing_what_it_lacks():
    r = RangeSet([(0, 5)])
    with pytest.raises(ValueError, match=r"\[4, 6\) overlaps"):
        r.add(4, 6)
    with pytest.raises(ValueError, match=r"\[4, 6\) is not all in"):
        r.remove(4, 6)
    with pytest.raises(ValueError, match="empty range"):
        r.add(3, 3)


# --- leasing ----------------------------------------------------------------------------------

def test_leases_are_disjoint_lowest_first_and_cover_the_epoch():
    b = book()
    leases = [grant(b, f"worker:{i % 2}", 30) for i in range(4)]
    assert [(l.start, l.end) for l in leases] == [(0, 30), (30, 60), (60, 90), (90, 100)]
    assert {l.epoch for l in leases} == {0}
    assert_partition(b, 0)


def test_next_epoch_opens_when_the_current_has_no_free_position():
    b = book()
    first = grant(b, count=N)
    second = grant(b, "worker:1", count=10)
    assert (second.epoch, second.start) == (1, 0) and first.epoch == 0
    assert b.epoch == 0  # the oldest not complete


def test_wait_names_holders_when_every_open_epoch_is_out():
    b = book(max_open_epochs=1)
    grant(b, "worker:0", count=N)
    g = b.lease("worker:1", "h1", 10)
    assert g.state is LeaseState.WAIT and g.held_by == ("worker:0",)


def test_until_epoch_exhausts_once_those_epochs_are_consumed():
    b = book()
    lease = grant(b, count=N, until=1)
    assert b.lease("worker:1", "h1", 10, 1).state is LeaseState.WAIT  # epoch 0 still out, epoch 1 not asked for
    consume(b, "worker:0", use(lease))
    assert b.lease("worker:1", "h1", 10, 1).state is LeaseState.EXHAUSTED
    assert b.lease("worker:1", "h1", 10).state is LeaseState.GRANTED


# --- reports: each outcome --------------------------------------------------------------------

def test_consumed_positions_complete_the_epoch_exactly_once():
    b = book()
    a, c = grant(b, count=60), grant(b, "worker:1", count=60)
    assert consume(b, "worker:0", use(a, 0, 20)) == []
    assert consume(b, "worker:0", use(a, 20, 60)) == []
    (summary,) = consume(b, "worker:1", use(c))
    assert (summary.epoch, summary.consumed, summary.requeued, summary.lost) == (0, N, 0, 0)
    assert b.completed == 1 and b.epoch == 1


def test_pending_positions_are_consumed_when_their_step_is_reached():
    b = book()
    lease = grant(b, count=N)
    hold(b, "worker:0", use(lease, 0, 50), step=3)
    hold(b, "worker:0", use(lease, 50, 100), step=4)
    assert_partition(b, 0)
    assert b.step_reached(4) == [] and b.counts().consumed == 50 and b.counts().pending == 50
    (summary,) = b.step_reached(5)
    assert summary.consumed == N


def test_abandoned_step_requeues_its_pending_positions():
    b = book()
    lease = grant(b, count=40)
    hold(b, "worker:0", use(lease, 0, 10), step=2)
    hold(b, "worker:0", use(lease, 10, 20), step=3)
    assert b.step_abandoned(3) == 10
    assert b.counts().requeued == 10 and b.counts().pending == 10
    assert_partition(b, 0)
    again = grant(b, "worker:1", count=100)
    assert (again.start, again.end) == (10, 20)  # requeued positions go out first (lowest first)


def test_stale_or_duplicate_positions_go_back_to_the_queue():
    b = book()
    lease = grant(b, count=20)
    requeue(b, "worker:0", use(lease, 5, 10))
    assert b.counts().requeued == 5 and b.counts().leased == 15
    assert_partition(b, 0)


def test_release_requeues_what_the_task_did_not_report_and_keeps_its_pending():
    b = book()
    lease = grant(b, count=30)
    consume(b, "worker:0", use(lease, 0, 10))
    hold(b, "worker:0", use(lease, 10, 15), step=0)
    assert b.release("worker:0") == 15
    assert b.release("worker:0") == 0  # idempotent
    assert b.leases_of("worker:0") == ()
    c = b.counts()
    assert (c.consumed, c.pending, c.leased, c.requeued) == (10, 5, 0, 15)
    assert_partition(b, 0)


def test_a_new_holder_of_the_same_task_releases_the_old_leases_first():
    b = book()
    old = grant(b, count=30, holder="first-process")
    g = b.lease("worker:0", "second-process", 10)
    assert g.released == 30 and g.lease.start == 0  # the restarted worker gets them back itself
    assert b.sort("worker:0", "book-a", use(old)).lost == tuple(use(old))  # a late push of them: counted lost


def test_other_books_positions_are_counted_lost_not_consumed():
    b = book()
    assert b.sort("worker:0", "book-before-restart", [(99, 0, 10)]).foreign
    grant(b)
    assert b.lose([(99, 0, 10)]) == 10
    assert b.counts().lost == 10 and b.counts().consumed == 0


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("ranges, message", [
    ([(1, 5, 3)], r"positions \[5, 3\) of lease 1; positions must satisfy 0 <= start < end <= 100"),
    ([(1, 0, 101)], r"\[0, 101\).*<= 100"),
    ([(42, 0, 5)], r"lease 42, which was never issued by this ps"),
    ([(1, 5, 15)], r"\[5, 15\) of lease 1 \(epoch 0, \[0, 10\)\), but they are outside it"),
    ([(1, 0, 5), (1, 4, 6)], r"\[4, 6\) of lease 1 twice in one push"),
])
def test_bad_reports_are_refused_naming_the_value(ranges, message):
    b = book()
    grant(b, count=10)
    with pytest.raises(LeaseError, match=message):
        b.sort("worker:0", "book-a", ranges)
    assert_partition(b, 0)  # nothing changed


def test_report_of_another_tasks_lease_is_refused_naming_the_owner():
    b = book()
    lease = grant(b, "worker:1", count=10)
    with pytest.raises(LeaseError, match=f"lease {lease.id}, which is leased to worker:1"):
        consume(b, "worker:0", use(lease))


def test_a_report_twice_is_counted_once():
    b = book()
    lease = grant(b, count=10)
    consume(b, "worker:0", use(lease, 0, 5))
    consume(b, "worker:0", use(lease, 0, 5))  # a resent push: nothing left to count
    c = b.counts()
    assert (c.consumed, c.leased, c.lost) == (5, 5, 0)
    assert_partition(b, 0)


@pytest.mark.parametrize("count", [0, -3, 2.5, True])
def test_bad_lease_counts_are_refused(count):
    with pytest.raises(LeaseError, match=f"asked for {count!r} positions"):
        book().lease("worker:0", "h", count)


def test_a_task_may_hold_only_so_many_leases():
    b = book(max_leases_per_task=2)
    grant(b, count=1)
    grant(b, count=1)
    with pytest.raises(LeaseError, match="already holds 2 leases"):
        b.lease("worker:0", "h0", 1)


@pytest.mark.parametrize("n", [0, -1, 1 << 49, "100"])
def test_bad_data_set_sizes_are_refused(n):
    with pytest.raises(LeaseError, match="num_examples must be an int"):
        LeaseBook("b", n, 0)


# --- checkpoints ------------------------------------------------------------------------------

def test_restored_book_continues_the_epoch_and_frees_leased_and_pending_positions():
    b = book()
    a = grant(b, count=40)
    consume(b, "worker:0", use(a, 0, 30))
    hold(b, "worker:0", use(a, 30, 35), step=1)
    requeue(b, "worker:0", use(a, 35, 40))
    state = b.export()
    restored = LeaseBook.restore("book-b", state)
    c = restored.counts()
    assert (c.epoch, c.consumed, c.leased, c.pending, c.requeued) == (0, 30, 0, 0, 5)
    lease = restored.lease("worker:3", "h", N).lease
    assert (lease.epoch, lease.start, lease.end) == (0, 30, 100)
    (summary,) = consume(restored, "worker:3", use(lease))
    assert summary.consumed == N


def test_restore_round_trips_two_open_epochs():
    b = book()
    first = grant(b, count=N)
    second = grant(b, "worker:1", count=50)
    consume(b, "worker:1", use(second, 0, 20))
    consume(b, "worker:0", use(first, 50, 60))
    state = LeaseBook.restore("b2", b.export()).export()
    assert state == b.export()


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.update(version=2), "version must be 1"),
    (lambda s: s.update(num_examples=-1), "'num_examples' must be an int"),
    (lambda s: s["epochs"][0].update(consumed=[[5, 3]]), r"bad consumed range \[5, 3\]"),
    (lambda s: s["epochs"][0].update(consumed=[[0, 10], [5, 20]]), r"bad consumed range \[5, 20\]"),
    (lambda s: s["epochs"][0].update(epoch=9), "'epoch' must be an int from 0 to 0"),
    (lambda s: s.update(epochs="all"), "'epochs' must be a list"),
])
def test_restore_refuses_a_damaged_state_naming_the_value(mutate, message):
    b = book()
    lease = grant(b, count=10)
    consume(b, "worker:0", use(lease))
    state = b.export()
    mutate(state)
    with pytest.raises(LeaseError, match=message):
        LeaseBook.restore("b2", state)


def test_random_interleavings_keep_every_position_in_exactly_one_state():
    rng = random.Random(0)
    b = book(n=257)
    step = 0
    for _ in range(2000):
        task = f"worker:{rng.randrange(3)}"
        action = rng.random()
        held = [l for l in b.leases_of(task)]
        if action < 0.3 or not held:
            b.lease(task, "h", rng.randrange(1, 40))
        elif action < 0.9:
            lease = rng.choice(held)
            o = b._leases[lease.id].outstanding
            s, e = next(iter(o))
            e = rng.randrange(s + 1, e + 1)
            kind = rng.random()
            if kind < 0.5:
                consume(b, task, [(lease.id, s, e)])
            elif kind < 0.8:
                hold(b, task, [(lease.id, s, e)], step)
            else:
                requeue(b, task, [(lease.id, s, e)])
        elif action < 0.95:
            step += 1
            b.step_reached(step)
        elif action < 0.97:
            b.step_abandoned(step)
        else:
            b.release(task)
        for epoch in b._open:
            assert_partition(b, epoch)
    assert b.completed >= 1


def reported(s, used):
    """Of `used` positions sorted into `s`, how many were reported before: neither fresh nor lost."""
    return used - sum(end - start for _, start, end in s.fresh + s.lost)


def test_sort_tells_fresh_reported_and_given_back_positions_apart():
    b = book()
    a = grant(b, count=20)
    consume(b, "worker:0", use(a, 0, 5))
    done = grant(b, count=5)
    consume(b, "worker:0", use(done))  # used up: remembered for a resent push
    given_back = grant(b, "worker:1", count=10)
    b.release("worker:1")
    s = b.sort("worker:0", "book-a", [(a.id, 0, 10), (done.id, done.start, done.end)])
    assert (s.fresh, reported(s, 15), s.lost, s.foreign) == (((a.id, 5, 10),), 10, (), False)
    s = b.sort("worker:1", "book-a", use(given_back))
    assert (s.fresh, reported(s, 10), s.lost) == ((), 0, tuple(use(given_back)))
    assert b.sort("worker:0", "book-before", [(7, 0, 10)]).foreign
    assert_partition(b, 0)  # sorting changes nothing
