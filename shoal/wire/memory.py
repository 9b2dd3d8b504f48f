"""Keep freed message buffers in the process instead of handing them back to the kernel.

glibc returns big freed blocks to the kernel (munmap, heap trimming) and then faults fresh
zeroed pages in for the next message: pushing a 128 MiB tensor in 4 MiB chunks cost about 19k
page faults on each side (bench/ps_bandwidth.py). A parameter server and its workers receive
the same sizes every step, so keeping the memory mapped is the right trade.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20   # glibc's upper limit on 64-bit: larger blocks are always mmap'ed
_TRIM_THRESHOLD = 1 << 30
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once; later calls do nothing).
    Returns whether they were set (False off glibc). Does not block; not thread-safe."""
    global _done
    if _done:
        return True
    _done = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (macOS, musl): nothing to tune
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    log.debug("mallopt mmap/trim thresholds set: %s", ok)
    return ok
