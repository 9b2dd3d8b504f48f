"""The closure ledger: a fixed memory cost per remembered tag, however many shards its pushes
carry, and the shards of each tag told apart."""

import tracemalloc

from shoal.ps.closure_ledger import ClosureLedger
from shoal.ps.protocol import ClosureTag

SHARDS = 300


def _names():
    # fresh strings for every push, as the wire decodes them
    return [f"model/layer_{i:04d}/kernel/part_{i % 7}" for i in range(SHARDS)]


def test_the_ledger_costs_a_bounded_amount_per_tag_however_many_shards_a_push_carries():
    window = 300
    ledger = ClosureLedger(window)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(2 * window):  # a long job: two windows of tagged pushes
            ledger.record(ClosureTag(f"{n // 10:012x}.{n // 10}", n % 10), _names(), n)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(ledger) == window
    # a tag's key, its shards and its step: a few hundred bytes, not a copy of its 300 shard names
    assert grown < window * 1024, f"{grown / window:.0f} bytes per tag"
    newest = ClosureTag(f"{(2 * window - 1) // 10:012x}.{(2 * window - 1) // 10}", (2 * window - 1) % 10)
    assert ledger.is_duplicate(newest, _names()) and ledger.step_of(newest) == 2 * window - 1


def test_the_ledger_tells_apart_the_shards_of_one_tag():
    ledger = ClosureLedger()
    tag = ClosureTag("c.1", 0)
    ledger.record(tag, ["a", "b"], 3)
    assert not ledger.is_duplicate(tag, ["c"])  # another part of the same push
    ledger.record(tag, ["c"], 3)
    assert ledger.is_duplicate(tag, ["b", "a"]) and ledger.is_duplicate(tag, ["c"])
    assert not ledger.is_duplicate(ClosureTag("c.1", 1), ["a"])
    assert (ledger.applied, ledger.duplicates) == (2, 2)
