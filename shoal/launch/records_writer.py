"""`RecordsWriter`: the launcher's writes to the job records, kept from ending the job. A
write that fails (a full disk under SHOAL_HOME, a damaged jobs.db: WorkspaceError) is said
once through `notify` and dropped, and the job goes on: its tasks, their output and the
launcher's teardown do not need the records. Later writes are tried as they come (each
records the latest state, so the first that works again brings the record up to date for
what it writes); the first that works after a failure says so.

Thread-safe (the supervisor's thread and the output readers both write); each call blocks on
the store (SQLite's locks, bounded by its timeout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shoal.launch.errors import WorkspaceError


class RecordsWriter:
    """Calls a JobStore's write methods for the launcher (see the module docstring)."""

    def __init__(self, notify: Callable[[str], None]) -> None:
        self._notify = notify
        self._lock = threading.Lock()
        self._failing = False

    def call(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """`write(*args, **kwargs)`; False (said once) if the records could not take it."""
        try:
            write(*args, **kwargs)
        except WorkspaceError as e:
            with self._lock:
                first, self._failing = not self._failing, True
            if first:
                self._notify(f"shoal | {e} — the job goes on; shoal status shows it as last recorded until"
                             " the records can be written again")
            return False
        with self._lock:
            recovered, self._failing = self._failing, False
        if recovered:
            self._notify("shoal | the job records can be written again")
        return True
