"""`HostRepairs`: what makes a lost host usable again — a new agent over ssh, a new agent step
under Slurm — done in the background, so that a task waiting to be restarted there does not
hold up the job: while ssh waits out its connect timeout or a lost step is waited for, the
supervisor goes on serving the other tasks, Ctrl-C, `shoal kill` and the deadline.

An executor's `start` asks `ensure(node, ...)` before it starts any task: on a host whose
connection is lost, the first call starts the repair on a thread of its own and raises
StartDeferred (the supervisor asks again shortly, without counting a restart); later calls
raise StartDeferred while it runs, then return once it has installed its new connection in the
executor, or raise, once, the error it ended with (a HostUnreachableError counts a restart and
is tried again after the backoff, as before). A new connection lost again before a task could
use it is such an error too, so that a host that keeps dropping uses up restarts instead of
being repaired without end. One repair per host runs at a time: two at once would each clear
the host of what the other had just started.

The thread that ran a successful repair lives until `close`: the processes it started (ssh,
srun) get the kernel's parent-death signal when the thread that forked them ends
(parent_death.py). A daemon thread, so that the launcher never waits for a repair to exit.

Thread-safe; nothing here blocks but `repair` itself, on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

from shoal.launch.errors import HostUnreachableError, StartDeferred, StartError

log = logging.getLogger(__name__)

STALE_S = 5.0
"""A repair's error not asked for within this long is dropped (the host may be back): the next
start tries again."""


class HostRepairs:
    """The background repairs of one executor's hosts (see the module docstring)."""

    def __init__(self, notify: Callable[[str], None]) -> None:
        self._notify = notify
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._failed: dict[str, tuple[float, BaseException]] = {}
        self._repaired: set[str] = set()  # hosts whose last repair succeeded, not yet used
        self._closed = threading.Event()

    def ensure(self, node: str, label: str, repair: Callable[[], None], why: str,
               usable: Callable[[], bool]) -> None:
        """Return once `usable()` says `node` can start tasks again (asked under this object's
        lock, so a repair that just ended well is seen). Else raise, once, the error the last
        repair of `node` ended with, its text after "`label` cannot be restarted on `node`: "
        (a StartError of the same class; anything else as a StartError naming its type), or
        HostUnreachableError if the connection the last repair made was lost again before a
        task used it; else StartDeferred while a repair runs, after starting `repair` if none
        does (saying `why` through notify). Never blocks."""
        with self._lock:
            if usable():
                self._repaired.discard(node)
                return
            if node in self._repaired:
                self._repaired.discard(node)
                raise HostUnreachableError(f"{label} cannot be restarted on {node}: the agent it was reconnected to"
                                           " was lost as well, before the task could start there")
            failed = self._failed.pop(node, None)
            if failed is None or time.monotonic() - failed[0] >= STALE_S:
                if node in self._running:
                    raise StartDeferred(f"{label} waits for {node} to be reconnected")
                if self._closed.is_set():
                    raise StartError(f"{label} is not restarted on {node}: the job is being stopped")
                self._running.add(node)
                failed = None
        if failed is not None:
            error = failed[1]
            if isinstance(error, StartError):
                raise type(error)(f"{label} cannot be restarted on {node}: {error}") from error
            raise StartError(f"{label} cannot be restarted on {node}: {type(error).__name__}: {error}") from error
        try:
            self._notify(f"shoal | {node}: {why}; the job goes on meanwhile")
            threading.Thread(target=self._run, args=(node, repair), name=f"repair-{node}", daemon=True).start()
        except BaseException:
            with self._lock:
                self._running.discard(node)
            raise
        raise StartDeferred(f"{label} waits for {node} to be reconnected")

    def close(self) -> None:
        """Let the threads of successful repairs end (their ssh or srun go with them: close
        the connections first); a repair still running ends as it will. Does not block."""
        self._closed.set()

    def _run(self, node: str, repair: Callable[[], None]) -> None:
        error: Optional[BaseException] = None
        try:
            repair()
        except BaseException as e:  # noqa: BLE001 - handed to the next start, which raises it
            error = e
            if not isinstance(e, StartError):  # a bug, not a host that is away: keep its traceback
                log.exception("repairing %s failed", node)
        with self._lock:
            self._running.discard(node)
            if error is not None:
                self._failed[node] = (time.monotonic(), error)
            else:
                self._repaired.add(node)
        if error is None:
            self._closed.wait()  # what the repair started dies with this thread
