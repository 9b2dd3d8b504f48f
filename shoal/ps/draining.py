"""`TermDrain`: when a ps that got SIGTERM may stop serving.

A launcher's teardown (`shoal kill`, a deadline) and a scheduler's preemption send SIGTERM to
every task at once. The chief then finishes its step and snapshots every ps for a final
checkpoint (shoal/train/shutdown.py) — so a ps must not vanish the moment SIGTERM arrives. It
keeps serving until the chief has finished (said done or failed, as a replica stopped by SIGTERM
does, after its final checkpoint) or every training replica has, or no replica ever talked to
it, or none has for `idle_s` seconds since the SIGTERM or the last request, whichever came later
(a replica that died without a word). SIGKILL after the grace period bounds all of it. Workers
still training when it stops see the ps go away and, having SIGTERM too, stop without waiting
for it to come back.

Pure policy: the server feeds it what it saw; no clock of its own, no I/O. Not thread-safe
(one per server, asked from the thread that joins it).
"""

from __future__ import annotations

from typing import Optional

DEFAULT_IDLE_S = 10.0


class TermDrain:
    """Decides when a ps that got SIGTERM at `term_at` stops (times are time.monotonic)."""

    def __init__(self, term_at: float, idle_s: float = DEFAULT_IDLE_S) -> None:
        self._term_at = term_at
        self._idle_s = idle_s

    def stop_reason(self, now: float, *, unfinished_replicas: int, chief_finished: bool,
                    last_request_at: Optional[float]) -> Optional[str]:
        """Why to stop now, or None to keep serving."""
        if last_request_at is None:
            return "SIGTERM; no training replica ever connected"
        if unfinished_replicas <= 0:
            return "SIGTERM; every training replica has finished"
        if chief_finished:
            return "SIGTERM; the chief has finished"
        quiet = now - max(last_request_at, self._term_at)
        if quiet >= self._idle_s:
            return (f"SIGTERM; {unfinished_replicas} training replica(s) not finished, but none sent a request"
                    f" for {quiet:.0f}s")
        return None
