"""`PsWatch`: the chief's watch over the ps tasks while it does not push (a coordinating chief,
in-graph replication; docs/coordinator.md).

A chief that trains notices a lost or restarted ps on its own pushes and rebuilds it (the
PsClient's `on_lost`, shoal/train/recovery.py). A chief that only schedules never pushes, so
without this no task would rebuild a ps that died: the workers would wait for the chief until
their recovery timeout. `PsWatch` asks every ps for its status every `every_s` seconds, on a
thread and a PsClient of its own, and hands a ps that is gone, or answers as a process other
than the one it saw (a restarted ps), to `recover` (the session's recovery: wait for the ps to
come back, then rebuild it from its successor's replica or the newest checkpoint).
"""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from typing import Callable

from shoal.ps.client import PsClient
from shoal.train.errors import TrainError
from shoal.wire import PeerLostError, PeerTimeoutError, WireError

log = logging.getLogger(__name__)

Recover = Callable[[PsClient, int, float, Exception], None]
"""recover(client, ps, deadline, cause): block until ps `ps` serves again (rebuilt), or raise."""

DEFAULT_EVERY_S = 1.0
"""How often the chief asks every ps whether it is still the process it knew."""

PROBE_TIMEOUT_S = 2.0
"""How long one status request may take before the ps counts as lost."""


class WatchState(Enum):
    """NEW -> WATCHING (`start`) -> CLOSED (`close`); NEW -> CLOSED. CLOSED is final."""

    NEW = "new"
    WATCHING = "watching"
    CLOSED = "closed"


class PsRestartedError(TrainError):
    """A ps answers, but as another process than the one the chief watched: it restarted."""


class PsWatch:
    """Watches every ps of `client` on a daemon thread and recovers one that is lost or restarted.

    `client` is used by the watch's thread only (give it a PsClient of its own, without
    `on_lost`); the watch closes it. `recover` runs on that thread, with `recovery_timeout_s`
    to its deadline; it must be safe against the session's own recovery (the session serializes
    the two), and may close the watch instead of recovering (the job is ending). A recovery
    that fails is logged and the watch goes on. The constructor does no I/O; `start` returns
    at once; `close` is idempotent and blocks up to `close_timeout_s` for the thread (a
    recovery still running then finishes on its own, a daemon). `start` and `close` are
    thread-safe.
    """

    def __init__(self, task: str, client: PsClient, recover: Recover, *, recovery_timeout_s: float,
                 every_s: float = DEFAULT_EVERY_S, probe_timeout_s: float = PROBE_TIMEOUT_S):
        if not every_s > 0:
            raise TrainError(f"a ps watch's every_s must be > 0 seconds, got {every_s!r}")
        self.task = task
        self.every_s = every_s
        self._client = client
        self._recover = recover
        self._recovery_timeout_s = recovery_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._known: list[str | None] = [None] * client.num_ps  # incarnations; None: adopt the next ready one
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._state = WatchState.NEW
        self.recoveries = 0  # ps tasks recovered since start (read by tests and logs)

    @property
    def state(self) -> WatchState:
        return self._state

    def __enter__(self) -> "PsWatch":
        return self.start() if self._state is WatchState.NEW else self  # `with session.watch_ps():` is started

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "PsWatch":
        """Start watching. Does not block. Returns self."""
        with self._lock:
            if self._state is not WatchState.NEW:
                raise TrainError(f"{self.task}: start() on a ps watch that is {self._state.value}; create a new one")
            self._state = WatchState.WATCHING
            self._thread = threading.Thread(target=self._run, name=f"{self.task} ps watch", daemon=True)
            self._thread.start()
        log.info("%s watches its %d ps tasks (every %gs) and rebuilds one that is lost or restarted", self.task,
                 self._client.num_ps, self.every_s)
        return self

    def close(self, close_timeout_s: float = 5.0) -> None:
        """Stop watching. Idempotent; blocks up to `close_timeout_s`."""
        with self._lock:
            if self._state is WatchState.CLOSED:
                return
            started, self._state = self._state is WatchState.WATCHING, WatchState.CLOSED
            self._stopping.set()
        if not started:
            self._client.close()
        elif self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(close_timeout_s)

    # -- the watch's thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.wait(self.every_s):
                for ps in range(self._client.num_ps):
                    if self._stopping.is_set():
                        return
                    self._watch(ps)
        finally:
            self._client.close()

    def _watch(self, ps: int) -> None:
        cause = self._check(ps)
        if cause is None:
            return
        self._known[ps] = None  # the rebuilt process is adopted once it answers ready
        try:
            self._recover(self._client, ps, time.monotonic() + self._recovery_timeout_s, cause)
            if not self._stopping.is_set():  # `recover` may close the watch instead (the job is ending)
                self.recoveries += 1
        except Exception as e:  # noqa: BLE001 — the thread must go on; the workers fail with their own error
            log.error("%s could not recover ps:%d at %s: %s", self.task, ps, self._client.addresses[ps], e)

    def _check(self, ps: int) -> Exception | None:
        """None while ps `ps` is the ready process it was; else why it needs recovering."""
        try:
            status = self._client.status(ps, self._probe_timeout_s)
        except (PeerLostError, PeerTimeoutError) as e:
            return e
        except WireError as e:  # a refusal: not a lost ps; say so, and ask again next time
            log.warning("%s: ps:%d refused a status request: %s", self.task, ps, e)
            return None
        known = self._known[ps]
        if status.ready and known in (None, status.incarnation):
            self._known[ps] = status.incarnation
            return None
        what = "is not initialized" if not status.ready else f"answers as process {status.incarnation}"
        return PsRestartedError(f"ps:{ps} at {self._client.addresses[ps]} restarted: it {what}"
                                + (f", the chief knew process {known}" if known else ""))
