"""`RefusalLog`: a server's WARNING lines about the peers it refused, rate-limited.

A worker started with another job secret, or a port scanner, is refused during the handshake
and never reaches Shoal; the server says so, with the peer's address and why, so the mismatch
is visible on the ps side too. A peer that retries (zmq reconnects every few hundred
milliseconds) or a flood of peers must not flood the log, so:

- the first refusal of an (address, reason) is logged at once, later ones at most once per
  `every_s`, with how many were refused since the last line;
- at most `burst` lines per `every_s` in all (a flood from many addresses); the refusals not
  logged are counted in the next line;
- at most `max_keys` (address, reason) pairs are remembered (the least recently refused go).

Times are whatever monotonic clock the caller passes. Not thread-safe: one per server, called
from its gatekeeper thread.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Seen:
    next_line: float
    since: int = 0  # refused since its last line


class RefusalLog:
    """Logs "NAME refused a peer at ADDRESS: REASON" lines to `log`, rate-limited (see module)."""

    def __init__(self, log: logging.Logger, name: str, *, every_s: float = 60.0, burst: int = 10,
                 max_keys: int = 256) -> None:
        self._log = log
        self.name = name
        self.every_s = every_s
        self.burst = burst
        self.max_keys = max_keys
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._window_end = float("-inf")
        self._lines_in_window = 0
        self._unlogged = 0  # refusals dropped by the `burst` bound since the last line

    def refused(self, address: str, reason: str, now: float) -> bool:
        """Count one refusal of the peer at `address`; returns whether a line was logged."""
        key = (address, reason)
        seen = self._seen.get(key)
        if seen is not None:
            self._seen.move_to_end(key)
            if now < seen.next_line:
                seen.since += 1
                return False
        if not self._take_line(now):
            self._unlogged += 1
            if seen is not None:
                seen.since += 1
            return False
        since = seen.since if seen is not None else 0
        more = f" ({since} more from it in the last {self.every_s:.0f}s)" if since else ""
        others = f" ({self._unlogged} other refusals not logged)" if self._unlogged else ""
        self._log.warning("%s refused a peer at %s: %s%s%s", self.name, address, reason, more, others)
        self._unlogged = 0
        self._seen[key] = _Seen(now + self.every_s)
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return True

    def _take_line(self, now: float) -> bool:
        if now >= self._window_end:
            self._window_end, self._lines_in_window = now + self.every_s, 0
        if self._lines_in_window >= self.burst:
            return False
        self._lines_in_window += 1
        return True
