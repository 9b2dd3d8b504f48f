"""`ReplicationLog`: what a ps's replicas cost, said at a rate a log can take.

A ps replicating every step (`--replicate_every_steps 1`) or every second would write a line per
copy: hundreds a minute that drown everything else the job says. So the first copy to a
successor (and the first after an outage) is an INFO line with its figures; each copy after it
is a DEBUG line (`SHOAL_LOG_LEVEL=DEBUG` shows them; the `shoal.ps.replicator` logger), and every
`summary_every_s` an INFO line sums up the copies since the last one:

    ps:0 replicated step 1200 to ps:1: 4 tensors, 31.4 kB, copy 0.05 ms, send 1.2 ms (held: step 1198)
    ps:0 replicated to ps:1 57 times in 60 s, last step 4711 (copy 0.05 ms, send 1.3 ms: medians)

Called from the replicator's sending thread only; does not block.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

from shoal.wording import counted

log = logging.getLogger("shoal.ps.replicator")

SUMMARY_EVERY_S = 60.0
"""How often the copies since the last summary are summed up in one INFO line."""


class ReplicationLog:
    """The log lines of ps `source`'s replicas to ps `successor`. `clock` is time.monotonic
    unless a test injects one."""

    def __init__(self, source: int, successor: int, *, summary_every_s: float = SUMMARY_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._successor = successor
        self._summary_every_s = summary_every_s
        self._clock = clock
        self._said_first = False
        self._since = clock()
        self._copies: list[tuple[float, float]] = []  # (copy ms, send ms) since the last summary
        self._last_step = -1

    def copied(self, step: int, tensors: int, nbytes: int, copy_ms: float, send_ms: float, held_step: int) -> None:
        """One replica of `step` reached the successor, which now holds `held_step`."""
        level = logging.DEBUG if self._said_first else logging.INFO
        log.log(level, "ps:%d replicated step %d to ps:%d: %d tensors, %.1f kB, copy %.2f ms, send %.1f ms (held: step %d)",
                self._source, step, self._successor, tensors, nbytes / 1e3, copy_ms, send_ms, held_step)
        if not self._said_first:
            self._said_first = True
            self._since = self._clock()
            return
        self._copies.append((copy_ms, send_ms))
        self._last_step = step
        now = self._clock()
        if now - self._since >= self._summary_every_s:
            self._summary(now)

    def resumed(self) -> None:
        """The successor answers again after an outage: its next copy gets an INFO line."""
        log.info("ps:%d replicates to ps:%d again", self._source, self._successor)
        self._said_first = False
        self._copies = []  # the next summary counts from the copy said at INFO on

    def _summary(self, now: float) -> None:
        copies = self._copies
        log.info("ps:%d replicated to ps:%d %s in %.0f s, last step %d (copy %.2f ms, send %.1f ms: medians)",
                 self._source, self._successor, counted(len(copies), "time"), now - self._since,
                 self._last_step, statistics.median(c for c, _ in copies), statistics.median(s for _, s in copies))
        self._copies, self._since = [], now
