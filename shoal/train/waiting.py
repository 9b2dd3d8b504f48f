"""`poll_until`: the one bounded poll loop behind every wait of a worker (ps tasks coming up,
the chief initializing, a lost ps coming back). Every wait says what it waits for every few
seconds (`LOG_EVERY_S`), e.g. "worker:0 waiting for ps:1 at host:2222 (12s of 120s)"."""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

T = TypeVar("T")

LOG_EVERY_S = 5.0
"""How often a wait logs what it still waits for."""


def poll_until(probe: Callable[[], "T | None"], *, deadline: "float | Callable[[], float]", interval_s: float,
               timed_out: Callable[[], Exception], waiting: Callable[[float], None] | None = None,
               log_every_s: float = LOG_EVERY_S, stop: Callable[[], None] | None = None) -> T:
    """Call `probe()` every `interval_s` until it returns something other than None, and
    return that. At `deadline` (time.monotonic; a callable is asked at each poll, for a wait
    that a probe may extend) raise `timed_out()`. Every `log_every_s` while
    waiting, call `waiting(seconds waited so far)` (to log who is missing). `stop()` is called
    before each probe: it raises to end the wait early (SIGTERM: the session's GracefulStop).
    Blocks; the probe bounds its own calls."""
    started = last_log = time.monotonic()
    while True:
        if stop is not None:
            stop()
        result = probe()
        if result is not None:
            return result
        now, end = time.monotonic(), deadline() if callable(deadline) else deadline
        if now >= end:
            raise timed_out()
        if waiting is not None and now - last_log >= log_every_s:
            waiting(now - started)
            last_log = now
        time.sleep(min(interval_s, max(0.0, end - now)))


def log_waiting(log: logging.Logger, what: "str | Callable[[], str]", total_s: float,
                deadline: float | None = None) -> Callable[[float], None]:
    """A `waiting` callback that logs "<what> (Ns of Ms)" at INFO; `what` may be a callable
    that says what is still missing at the time. With `deadline` (time.monotonic) N counts
    from the start of the whole wait of `total_s` that ends there, not of this poll: waits
    that take over from one another go on counting."""
    def waiting(waited: float) -> None:
        if deadline is not None:
            waited = total_s - max(0.0, deadline - time.monotonic())
        log.info("%s (%.0fs of %.0fs)", what() if callable(what) else what, waited, total_s)
    return waiting
