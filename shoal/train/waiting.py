"""`poll_until`: the one bounded poll loop behind every wait of a worker (ps tasks coming up,
the chief initializing, a lost ps coming back)."""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(probe: Callable[[], "T | None"], *, deadline: float, interval_s: float,
               timed_out: Callable[[], Exception], waiting: Callable[[float], None] | None = None,
               log_every_s: float = 10.0) -> T:
    """Call `probe()` every `interval_s` until it returns something other than None, and
    return that. At `deadline` (time.monotonic) raise `timed_out()`. Every `log_every_s` while
    waiting, call `waiting(seconds waited so far)` (to log who is missing). Blocks; the probe
    bounds its own calls."""
    started = last_log = time.monotonic()
    while True:
        result = probe()
        if result is not None:
            return result
        now = time.monotonic()
        if now >= deadline:
            raise timed_out()
        if waiting is not None and now - last_log >= log_every_s:
            waiting(now - started)
            last_log = now
        time.sleep(min(interval_s, max(0.0, deadline - now)))


def log_waiting(log: logging.Logger, what: str, total_s: float) -> Callable[[float], None]:
    """A `waiting` callback that logs "<what> (Ns of Ms)" at INFO."""
    return lambda waited: log.info("%s (%.0fs of %.0fs)", what, waited, total_s)
