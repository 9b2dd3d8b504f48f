"""`PsWatch`: the chief's watch over the ps tasks while it does not push (a coordinating chief,
in-graph replication; docs/coordinator.md).

A chief that trains notices a lost or restarted ps on its own pushes and rebuilds it (the
PsClient's `on_lost`, shoal/train/recovery.py). A chief that only schedules never pushes, so
without this no task would rebuild a ps that died: the workers would wait for the chief until
their recovery timeout. `PsWatch` asks every ps for its status every `every_s` seconds, on a
thread and a PsClient of its own, and hands a ps that is gone, or answers as a process other
than the one it saw (a restarted ps), to `recover` (the session's recovery: wait for the ps to
come back, then rebuild it from its successor's replica or the newest checkpoint).

The session's own recovery may re-home a ps meanwhile (shoal/train/rehoming.py): its client
drops the ps, and the ps after it are numbered one lower. Before each round, and again once it
holds the recovery lock, the watch drops every retired ps from its own client too, so it never
probes a retired ps and hands `recover` the numbering the session's placement has now.
"""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Collection

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
    `on_lost`); the watch closes it. `recover` runs on that thread while the watch holds
    `serialize` (the session's recovery lock, which its own recovery also takes), with
    `recovery_timeout_s` to its deadline counted from when the watch got the lock; it may close
    the watch instead of recovering (the job is ending). `retired()` names the cluster indices
    of the ps tasks re-homed so far (thread-safe; read on the watch's thread): the watch drops
    them from `client` and stops watching them. A recovery
    that fails is logged and the watch goes on. The constructor does no I/O; `start` returns
    at once; `close` is idempotent and blocks up to `close_timeout_s` for the thread (a
    recovery still running then finishes on its own, a daemon). `start` and `close` are
    thread-safe.
    """

    def __init__(self, task: str, client: PsClient, recover: Recover, *, recovery_timeout_s: float,
                 every_s: float = DEFAULT_EVERY_S, probe_timeout_s: float = PROBE_TIMEOUT_S,
                 serialize: AbstractContextManager | None = None, retired: Callable[[], Collection[int]] = tuple):
        if not every_s > 0:
            raise TrainError(f"a ps watch's every_s must be > 0 seconds, got {every_s!r}")
        self.task = task
        self.every_s = every_s
        self._client = client
        self._recover = recover
        self._recovery_timeout_s = recovery_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._serialize = serialize if serialize is not None else nullcontext()
        self._retired = retired
        # incarnations by cluster index; None: adopt the next ready one
        self._known: dict[int, str | None] = {client.ps_id(k): None for k in range(client.num_ps)}
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
                self._forget_retired()
                for cluster_id in list(self._known):
                    if self._stopping.is_set():
                        return
                    self._watch(cluster_id)
        finally:
            self._client.close()

    def _watch(self, cluster_id: int) -> None:
        ps = self._index(cluster_id)
        cause = None if ps is None else self._check(ps)
        if cause is None:
            return
        self._known[cluster_id] = None  # the rebuilt process is adopted once it answers ready
        with self._serialize:  # the session's own recovery may have run meanwhile, and re-homed a ps
            if self._stopping.is_set():
                return  # closed while it waited for the lock: no recovery after the chief left
            self._forget_retired()
            ps = self._index(cluster_id)
            if ps is None:
                log.info("%s: ps:%d was re-homed; the watch no longer watches it", self.task, cluster_id)
                return
            try:
                self._recover(self._client, ps, time.monotonic() + self._recovery_timeout_s, cause)
                if not self._stopping.is_set():  # `recover` may close the watch instead (the job is ending)
                    self.recoveries += 1
            except Exception as e:  # noqa: BLE001 — the thread must go on; the workers fail with their own error
                log.error("%s could not recover ps:%d at %s: %s", self.task, cluster_id,
                          self._client.addresses[ps], e)

    def _forget_retired(self) -> None:
        """Drop every ps re-homed since the last call from the client (and the watch)."""
        for cluster_id in self._retired():
            ps = self._index(cluster_id)
            if ps is not None:
                self._client.drop(ps)
                del self._known[cluster_id]

    def _index(self, cluster_id: int) -> int | None:
        """The client's index of ps `cluster_id` now; None once it was dropped."""
        for k in range(self._client.num_ps):
            if self._client.ps_id(k) == cluster_id:
                return k
        return None

    def _check(self, ps: int) -> Exception | None:
        """None while the client's ps `ps` is the ready process it was; else why it needs recovering."""
        try:
            status = self._client.status(ps, self._probe_timeout_s)
        except (PeerLostError, PeerTimeoutError) as e:
            return e
        except WireError as e:  # a refusal: not a lost ps; say so, and ask again next time
            log.warning("%s: ps:%d refused a status request: %s", self.task, ps, e)
            return None
        cluster_id = self._client.ps_id(ps)
        known = self._known[cluster_id]
        if status.ready and known in (None, status.incarnation):
            self._known[cluster_id] = status.incarnation
            return None
        what = "is not initialized" if not status.ready else f"answers as process {status.incarnation}"
        return PsRestartedError(f"ps:{cluster_id} at {self._client.addresses[ps]} restarted: it {what}"
                                + (f", the chief knew process {known}" if known else ""))
