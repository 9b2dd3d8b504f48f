"""`QueuedJob`: a job recorded while its executor waits in a scheduler's queue.

A job `shoal train --slurm` submitted may wait in Slurm's queue for minutes or days before it
has nodes, so before its plan (addresses, tasks) exists. Told each new state of that wait (an
executor's `watch_queue`, shoal/launch/executor.py), it records the job PENDING with that state
as its reason — `shoal status` shows `PENDING (Slurm job 42 is PENDING (Resources))`, and
`shoal kill` finds its launcher — and the launcher's `create_job` completes the same record
(same number) once the job runs. Used as a context manager around allocating and planning the
job: if that raises (the job was cancelled, can never start, Ctrl-C, or SIGTERM, which stops the
wait as Ctrl-C does) the record says why.

Opens the records at the first state it is told and closes them on leaving the `with`. While
inside, on the main thread, SIGTERM and SIGINT stop the wait (raised where the thread is), but
never half-way through a write to the records: one that comes then is raised once the write is
done. Blocks on the records' SQLite locks only; not thread-safe (allocate's thread).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from shoal.launch.files import private_dirs
from shoal.launch.kill_request import kill_requested_by
from shoal.launch.processes import process_started
from shoal.launch.records import JobStore
from shoal.launch.setup_signals import StoppedSettingUp
from shoal.launch.states import JobState


class StoppedWaiting(StoppedSettingUp):
    """SIGTERM while the job waited in the queue: the launcher stops as after Ctrl-C."""


_STOPS = {signal.SIGTERM: StoppedWaiting, signal.SIGINT: KeyboardInterrupt}


class QueuedJob:
    """Job `job_id` (named `name`, its folder `job_dir`, run by an executor of kind `executor`)
    as it waits in a queue, recorded in `store` (not open yet). The constructor does no I/O."""

    def __init__(self, store: JobStore, job_id: str, name: str, job_dir: Path, executor: str) -> None:
        self._store = store
        self._job_id = job_id
        self._name = name
        self._job_dir = job_dir
        self._executor = executor
        self.number: int | None = None
        self._previous: dict[int, Any] = {}  # the handlers before __enter__
        self._writing = False  # a write to the records is under way: a stop waits for its end
        self._pending: int | None = None  # the signal that came meanwhile

    def update(self, text: str) -> None:
        """The wait's state is now `text`: record the job the first time, then its reason. A
        SIGTERM or SIGINT that comes meanwhile takes effect once the write is done (raised from
        here), never half-way through a transaction."""
        self._writing = True
        try:
            if self.number is None:
                self._store.open()
                private_dirs(self._job_dir, "the job's folder",
                             "set SHOAL_HOME to a writable directory (default ~/.shoal)")
                pid = os.getpid()
                self.number = self._store.create_queued(self._job_id, self._name, str(self._job_dir), pid,
                                                        process_started(pid) or 0.0, self._executor, text)
            else:
                self._store.set_job_state(self._job_id, JobState.PENDING, text)
        finally:
            self._writing = False
        if self._pending is not None:
            raise _STOPS[self._pending]()

    def _on_stop(self, signum: int, _frame: object) -> None:
        if self._writing:
            self._pending = signum
            return
        raise _STOPS[signum]()

    def __enter__(self) -> "QueuedJob":
        """From here on (on the main thread), SIGTERM — `shoal kill` from another terminal —
        stops the wait as Ctrl-C does: the executor's close cancels what it submitted."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_stop) for sig in _STOPS}
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        try:
            self._writing = True  # a stop now waits for the end to be recorded, then is raised
            if kind is StoppedWaiting:
                by = kill_requested_by(self._job_dir) or "SIGTERM"
                self._ended(JobState.KILLED, f"stopped by {by} before it started")
            elif kind is KeyboardInterrupt:
                self._ended(JobState.KILLED, "cancelled by Ctrl-C before it started")
            elif error is not None:
                self._ended(JobState.FAILED, str(error))
        finally:
            self._store.close()
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            self._previous = {}
            self._writing = False
        if self._pending is not None and kind is None:  # stopped as the job left the queue: stop now
            raise _STOPS[self._pending]()

    def _ended(self, state: JobState, reason: str) -> None:
        """No job came of the wait: record why, if the job was recorded and its end is not."""
        if self.number is not None and not self._store.find(self._job_id).state.is_terminal:
            self._store.set_job_state(self._job_id, state, reason, ended=True)
