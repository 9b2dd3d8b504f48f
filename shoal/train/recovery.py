"""Waiting for other tasks: parameter servers coming up, the chief initializing, and a lost ps
coming back (rebuilt by the chief). A mixin of TrainingSession; every call blocks, bounded by a
deadline, and none is thread-safe.
"""

from __future__ import annotations

import logging
import time

from shoal.train.errors import TrainError
from shoal.wire import PeerLostError, PeerTimeoutError, WireError

log = logging.getLogger("shoal.train.session")


class WaitsForTasks:
    """Bounded waits for the ps tasks and the chief, and recovery of a restarted ps."""

    def _wait_for_ps(self, deadline: float) -> list[dict]:
        """Poll every ps until all answer. Logs who is missing every 10 s."""
        started, last_log = time.monotonic(), 0.0
        while True:
            try:
                return self._status_all(min(2.0, max(0.1, deadline - time.monotonic())))
            except (PeerTimeoutError, PeerLostError) as e:
                now = time.monotonic()
                if now >= deadline:
                    raise TrainError(f"{self.task}: parameter servers did not come up within "
                                     f"{self.init_timeout_s:.0f}s ({e}); start the ps tasks or fix --ps_hosts") from e
                if now - last_log > 10:
                    log.info("%s waiting for parameter servers (%s) (%.0fs of %.0fs)", self.task,
                             ", ".join(self.config.ps_addresses), now - started, self.init_timeout_s)
                    last_log = now
                time.sleep(0.05)

    def _wait_for_chief(self, deadline: float) -> list[dict]:
        chief = self.config.chief_task
        started, last_log = time.monotonic(), time.monotonic()
        log.info("%s waiting for the chief (%s) to initialize the variables", self.task, chief)
        while True:
            statuses = self._status_all(self.request_timeout_s)
            if all(s["ready"] for s in statuses):
                return statuses
            now = time.monotonic()
            if now >= deadline:
                raise TrainError(f"{self.task}: the chief ({chief}) did not initialize the variables within "
                                 f"{self.init_timeout_s:.0f}s; is it running? (raise init_timeout_s if it is slow)")
            if now - last_log > 10:
                log.info("%s still waiting for the chief (%s) (%.0fs of %.0fs)", self.task, chief,
                         now - started, self.init_timeout_s)
                last_log = now
            time.sleep(0.2)

    def _restarted(self, ps: int) -> bool:
        """Whether ps `ps` answers as a different process than the one this worker started with."""
        try:
            status = self._clients[ps].call("status", timeout_s=2.0).header
        except WireError:
            return True
        return status.get("incarnation") != self._incarnations[ps]

    def _recover_ps(self, ps: int, deadline: float, cause: Exception) -> None:
        """Wait for a lost ps to answer again; the chief rebuilds its shards, others wait until
        it is ready. Raises TrainError at `deadline`. Blocks."""
        address = self.config.ps_addresses[ps]
        log.warning("%s lost ps:%d at %s (%s); waiting up to %.0fs for it to come back", self.task, ps, address,
                    cause, max(0.0, deadline - time.monotonic()))
        while True:
            try:
                status = self._clients[ps].call("status", timeout_s=2.0).header
            except WireError:
                status = None
            if status is not None and status["ready"]:
                self._incarnations[ps] = status.get("incarnation")
                log.info("%s: ps:%d is back at step %d", self.task, ps, status["step"])
                return
            if status is not None and self.config.is_chief:
                self._rebuild_ps(ps)
                continue
            if time.monotonic() >= deadline:
                waiting_for = (f"ps:{ps} at {address} did not come back" if status is None else
                               f"ps:{ps} came back but the chief ({self.config.chief_task}) did not restore it")
                raise TrainError(f"{self.task}: {waiting_for} within {self.ps_recovery_timeout_s:.0f}s; restart the "
                                 "ps task (the launcher does with restart: {policy: on-failure}) or raise "
                                 "ps_recovery_timeout_s") from cause
            time.sleep(0.2)
