"""Keep freed message buffers in the process instead of handing them back to the kernel.

glibc returns big freed blocks to the kernel (munmap, heap trimming) and then faults fresh
zeroed pages in for the next message: pushing a 128 MiB tensor in 4 MiB chunks cost about 19k
page faults on each side (bench/ps_bandwidth.py), and a 40 MiB shard's update-rule temporary
one fault per page on every push (tests/cluster/test_ps_page_faults.py). A parameter server and
its workers receive the same sizes every step, so keeping the memory mapped is the right trade.

Blocks above the mmap threshold are always mmap'ed and unmapped again on free, so it is raised
to MMAP_THRESHOLD (glibc 2.35 and later take any value; older ones refuse more than 32 MiB, the
fallback). A thread other than the main one allocates from an arena of its own, made of 64 MiB
heaps: a block larger than that is mmap'ed whatever the threshold. A ps serves on such a thread,
so `share_main_arena` (at the ps's start) sends the threads started after it to the main arena,
which grows without that limit: a whole-message push of a 128 MiB shard no longer faults its
update rule's temporaries in afresh every step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 1 << 30
_MMAP_THRESHOLD_FALLBACK = 32 << 20  # the most glibc before 2.35 accepts on 64-bit
_TRIM_THRESHOLD = 1 << 30
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once; later calls do nothing).
    Returns whether they were set (False off glibc, logged at debug). Does not block; not
    thread-safe."""
    global _done
    if _done:
        return True
    _done = True
    mallopt = _mallopt()
    if mallopt is None:
        log.debug("no mallopt (not glibc): freed memory goes back to the kernel as the allocator decides")
        return False
    mmap_ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) or bool(mallopt(_M_MMAP_THRESHOLD,
                                                                               _MMAP_THRESHOLD_FALLBACK))
    ok = mmap_ok and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    log.debug("mallopt mmap/trim thresholds set: %s", ok)
    return ok


def share_main_arena() -> bool:
    """Make threads that allocate for the first time after this call use glibc's main arena
    (M_ARENA_MAX 1) instead of an arena of their own; threads that already have one keep it.
    For a process whose work is one serving thread and zmq's I/O thread (a ps): it trades a
    little lock contention between them for big blocks that are reused instead of mmap'ed per
    request. Returns whether it was set (False off glibc). Does not block; not thread-safe."""
    mallopt = _mallopt()
    ok = mallopt is not None and bool(mallopt(_M_ARENA_MAX, 1))
    log.debug("glibc arenas limited to the main one: %s", ok)
    return ok


def _mallopt():
    """glibc's mallopt, or None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
