"""What a server says about a bad request, bounded: the error text of its reply, and its log lines.

An error message may quote what the peer sent (a field's value, the names it gave), and a peer
can send up to the header limit, 1 MiB. Quoted in full, such a text would not fit in a reply
header (encoding it failed, and that once stopped a ps), and each such request would write up to
megabytes to the log. So:

- `bounded(text)` cuts an error text to ERROR_TEXT_MAX characters, saying how much was cut;
- `BadRequestLog` logs "NAME refused a malformed message from a peer: ..." lines, each bounded,
  at most `burst` per `every_s` (the ones not logged are counted in the next line).

Times are whatever monotonic clock the caller passes. Not thread-safe: one per server, called from
its serving thread.
"""

from __future__ import annotations

import logging

ERROR_TEXT_MAX = 2000
"""The most characters of an error text a reply carries or a log line quotes."""


def bounded(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """`text`, or its first `limit` characters and how many more it had."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class BadRequestLog:
    """WARNING lines about malformed requests to `log`, rate-limited (see module)."""

    def __init__(self, log: logging.Logger, name: str, *, every_s: float = 60.0, burst: int = 10) -> None:
        self._log = log
        self._name = name
        self._every_s = every_s
        self._burst = burst
        self._window_end = float("-inf")
        self._lines = 0
        self._unlogged = 0

    def refused(self, why: str, now: float) -> bool:
        """Count one malformed request, refused because `why`; returns whether a line was logged."""
        if now >= self._window_end:
            self._window_end, self._lines = now + self._every_s, 0
        if self._lines >= self._burst:
            self._unlogged += 1
            return False
        self._lines += 1
        others = f" ({self._unlogged} more not logged in the last {self._every_s:.0f}s)" if self._unlogged else ""
        self._log.warning("%s refused a malformed message from a peer: %s%s", self._name, bounded(why), others)
        self._unlogged = 0
        return True
