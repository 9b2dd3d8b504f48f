"""One TensorBoard event file, written from a thread of its own: a slow or failing disk costs
summaries, never training.

`EventFile.add_scalar` never blocks. It puts the value on a bounded queue, or drops it when
the queue is full (the disk fell behind) or the file has failed. The writer thread turns the
values into events in tensorboardX's record format (what TensorBoard reads) and flushes them
every `flush_secs`. A write that fails with an OSError (a full disk, a filesystem gone
read-only), the first flush of a file opened on a full disk too, pauses the summaries: a
WARNING names the directory and the error (later pauses of the same summaries: INFO),
values are dropped meanwhile, and every `retry_secs` the writer thread tries a new event file
in the same directory; once one can be written (the disk was freed) the summaries go on there,
with one INFO line. A directory or file that cannot be created at `open`, or any other failure
(a bug), ends them. The caller goes on as before either way.

tensorboardX's SummaryWriter is not used for this: its writer thread dies on any OSError,
its bounded queue then fills, and the next `add_scalar` blocks its caller (the training
thread) forever.

States (`EventFileState`), and their transitions:

    NEW --open--> OPEN --close--> CLOSED
    NEW --open cannot create the file--> FAILED --close--> CLOSED
    OPEN --a write or flush fails (OSError)--> PAUSED --a new file is written--> OPEN
    PAUSED --close--> CLOSED
    OPEN or PAUSED --any other failure--> FAILED

Thread-safe as used: one thread (the task's training thread) calls `open`, `add_scalar`,
`flush` and `close`; the writer thread is the file's own.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import sys
import threading
import time
from contextlib import suppress
from enum import Enum
from itertools import count
from pathlib import Path

log = logging.getLogger(__name__)

FLUSH_SECS = 10.0
"""How long written events may wait in the file's buffer before they are flushed to disk."""
MAX_PENDING = 1000
"""Values waiting for the writer thread; more are dropped (the disk fell behind)."""
CLOSE_TIMEOUT_S = 5.0
"""How long `close` waits for the last events to reach the disk."""
RETRY_SECS = 60.0
"""How often paused summaries (a write failed) try a new event file."""

_FLUSH = object()  # queue items besides (wall_time, tag, value, step) tuples
_STOP = object()
_file_numbers = count()  # two files opened in the same second by one process get different names


class EventFileState(Enum):
    """Where an EventFile is in its life (the module docstring shows the transitions)."""

    NEW = "new"
    OPEN = "open"
    PAUSED = "paused"
    FAILED = "failed"
    CLOSED = "closed"


def _import_tensorboardx():
    """tensorboardX's RecordWriter, Event and scalar summary, without letting it import PyTorch.

    tensorboardX imports torch when it is installed, only to accept torch tensors, which costs
    1.4 s per task; we pass it floats. If torch is already loaded (a PyTorch program) it is used
    as is.
    """
    if "torch" in sys.modules:
        return _tensorboardx_parts()
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        return _tensorboardx_parts()
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def _tensorboardx_parts():
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import RecordWriter
    from tensorboardX.summary import scalar
    return RecordWriter, Event, scalar


class EventFile:
    """A TensorBoard event file in `logdir`, written by a thread of its own (module docstring)."""

    def __init__(self, logdir: str | os.PathLike, *, flush_secs: float = FLUSH_SECS, max_pending: int = MAX_PENDING,
                 retry_secs: float | None = None):
        self.logdir = Path(logdir)
        self.path: Path | None = None
        """The event file being written (a new one after summaries resumed)."""
        self._flush_secs = flush_secs
        self._retry_secs = RETRY_SECS if retry_secs is None else retry_secs
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, max_pending))
        self._state = EventFileState.NEW
        self._lock = threading.Lock()  # guards the state's transitions, made by both threads
        self._thread: threading.Thread | None = None
        self._tbx: tuple = ()  # tensorboardX's RecordWriter, Event and scalar, once open
        self._dropped = 0
        self._dropped_paused = 0  # about how many values were dropped since the summaries paused (both threads count)
        self._pauses = 0  # how often a failed write paused the summaries (the first warns)
        self._first_record_bytes = 0  # the size of an event file that holds its version record

    @property
    def state(self) -> EventFileState:
        return self._state

    def open(self) -> bool:
        """Create the directory and the event file, and start the writer thread. Blocks briefly
        (mkdir, open; the writer thread makes the first flush). Returns whether the file is open;
        when the filesystem refuses to create them, logs the one warning and returns False (every
        later call is then a no-op). Never raises OSError."""
        if self._state is not EventFileState.NEW:
            return self._state is EventFileState.OPEN
        self._tbx = _import_tensorboardx()
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
            records = self._new_file(flush=False)  # the writer thread flushes it: a full disk pauses, not fails
        except OSError as e:
            self._fail(e)
            return False
        self._state = EventFileState.OPEN
        self._thread = threading.Thread(target=self._write, args=(records, False), daemon=True,
                                        name=f"summaries {self.logdir}")
        self._thread.start()
        return True

    def _new_file(self, *, flush: bool):
        """A RecordWriter on a new event file in `logdir` (`path` names it), its first record
        (the file version) written, and with `flush` flushed to disk (fsync: the writer
        thread's job): a file can be created on a full disk, and only a flushed record says it
        can be written. Raises OSError (the file is then removed)."""
        record_writer, event, _ = self._tbx
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_numbers)}"
        path = self.logdir / name
        records = record_writer(str(path))
        try:
            first = event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
            self._first_record_bytes = len(first) + 16  # the record's length, its CRC, the data's CRC
            records.write(first)
            if flush:
                records.flush()
        except OSError:
            with suppress(OSError):
                records.close()
            with suppress(OSError):
                path.unlink()
            raise
        self.path = path
        return records

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Queue one value of `tag` at global step `step` for the writer thread. Never blocks:
        dropped when the file is not open (paused: counted) or the disk fell behind (one
        warning, the first time)."""
        if self._state is not EventFileState.OPEN:
            if self._state is EventFileState.PAUSED:
                self._dropped_paused += 1
            return
        try:
            self._queue.put_nowait((time.time(), tag, float(value), int(step)))
        except queue.Full:
            self._dropped += 1
            if self._dropped == 1:
                log.warning("summaries to %s fall behind: %d values wait for the disk; new ones are dropped until "
                            "it catches up; training goes on", self.logdir, self._queue.maxsize)

    def flush(self) -> None:
        """Ask the writer thread to flush what it wrote to disk now. Does not block or wait for it."""
        if self._state is EventFileState.OPEN:
            with suppress(queue.Full):
                self._queue.put_nowait(_FLUSH)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued, flush and close the file. Blocks up to `timeout_s` (a disk that
        does not answer loses the last values, with a warning). Idempotent; never raises."""
        if self._state is EventFileState.CLOSED:
            return
        thread = self._thread
        if thread is not None:
            deadline = time.monotonic() + timeout_s
            if self._state in (EventFileState.OPEN, EventFileState.PAUSED):
                with suppress(queue.Full):
                    self._queue.put(_STOP, timeout=timeout_s)
            thread.join(max(0.0, deadline - time.monotonic()))  # a failed writer is on its way out
        with self._lock:
            stuck = self._state is EventFileState.OPEN and thread is not None and thread.is_alive()
            paused = self._state is EventFileState.PAUSED
            self._state = EventFileState.CLOSED
        if stuck:
            log.warning("summaries to %s: the last values did not reach the disk within %.0fs; closed without them",
                        self.logdir, timeout_s)
        elif paused and self._dropped_paused:
            log.warning("summaries to %s were still paused at the end: %d values were dropped since the failed "
                        "write", self.logdir, self._dropped_paused)

    def _write(self, records, flushed: bool) -> None:
        """The writer thread: write into `records` (its version record on disk if `flushed`)
        until _STOP; after a write fails with an OSError, pause and go on in a new file once one
        can be written (`_resume`); any other failure ends the summaries."""
        while records is not None:
            try:
                self._write_file(records, flushed)
                return
            except OSError as e:
                failure = e
            except Exception as e:  # noqa: BLE001  # whatever it is, it must cost the summaries only
                self._fail(e)
                with suppress(OSError):
                    records.close()
                return
            self._discard(records)
            try:
                records = self._resume() if self._pause(failure) else None
            except Exception as e:  # noqa: BLE001
                self._fail(e)
                return
            flushed = True  # (`_resume` flushed the new file's version record)

    def _discard(self, records) -> None:
        """Close `records` after a failed write (the fd is closed even when its flush fails),
        and remove its file if not even the version record reached the disk (opened on a full
        disk)."""
        with suppress(OSError):
            records.close()
        with suppress(OSError):
            if self.path is not None and self.path.stat().st_size < self._first_record_bytes:
                self.path.unlink()

    def _write_file(self, records, flushed: bool) -> None:
        """Write each queued value into `records`, flush every `flush_secs`, close it at _STOP
        (`_finish`). Raises what the file raises before _STOP."""
        _, event, scalar = self._tbx
        if not flushed:
            records.flush()  # what was written before this thread took over (the file's version record)
        due = None  # when what was written since the last flush must be on disk
        while True:
            try:
                item = self._queue.get(timeout=None if due is None else max(0.0, due - time.monotonic()))
            except queue.Empty:
                item = _FLUSH
            if item is _STOP:
                self._finish(records, flush=due is not None)
                return
            if item is _FLUSH:
                if due is not None:
                    records.flush()
                    due = None
                continue
            wall_time, tag, value, step = item
            records.write(event(wall_time=wall_time, step=step, summary=scalar(tag, value)).SerializeToString())
            if due is None:
                due = time.monotonic() + self._flush_secs
            elif time.monotonic() >= due:
                records.flush()
                due = None

    def _finish(self, records, *, flush: bool) -> None:
        """At _STOP: flush (with `flush`) and close `records`; a failure now is the last one:
        nothing more will come to write, so it is said, not retried."""
        try:
            if flush:
                records.flush()
            records.close()
        except OSError as e:
            self._discard(records)
            log.warning("summaries to %s: the last values did not reach the disk: %s", self.logdir, _reason(e))

    def _pause(self, e: OSError) -> bool:
        """OPEN -> PAUSED, with a WARNING the first time and INFO after; False if the file was
        closed meanwhile."""
        with self._lock:
            if self._state is not EventFileState.OPEN:
                return False
            self._state = EventFileState.PAUSED
            self._dropped_paused = 0
        self._pauses += 1
        if self._pauses == 1:
            log.warning("summaries to %s stopped: %s; training goes on, and a new event file is tried every %gs (free "
                        "the disk or fix the directory; values meanwhile are dropped)", self.logdir, _reason(e),
                        self._retry_secs)
        else:  # a disk that hovers near full: one warning is enough
            log.info("summaries to %s paused again (%s); a new event file is tried every %gs", self.logdir, _reason(e),
                     self._retry_secs)
        return True

    def _resume(self):
        """While paused: drop what is queued and, every `retry_secs`, try a new event file whose
        first record reaches the disk. Returns its RecordWriter (state OPEN again), or None at
        _STOP or once closed."""
        while True:
            due = time.monotonic() + self._retry_secs
            while (left := due - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is _STOP:
                    return None
                if item is not _FLUSH:
                    self._dropped_paused += 1
            try:
                records = self._new_file(flush=True)
            except OSError:
                continue
            with self._lock:
                if self._state is not EventFileState.PAUSED:
                    with suppress(OSError):
                        records.close()
                    with suppress(OSError):
                        self.path.unlink()  # holds nothing but the version record
                    return None
                self._state = EventFileState.OPEN
            log.info("summaries to %s go on in %s (%d values were dropped meanwhile)", self.logdir,
                     self.path.name, self._dropped_paused)
            return records

    def _fail(self, e: Exception) -> None:
        """Log the one warning and stop taking values (either thread)."""
        with self._lock:
            if self._state not in (EventFileState.NEW, EventFileState.OPEN, EventFileState.PAUSED):
                return
            self._state = EventFileState.FAILED
        if isinstance(e, OSError):  # at open: the directory or the file cannot be made
            log.warning("summaries to %s stopped: %s; training goes on without them until this task starts again "
                        "(fix the directory for the next start)", self.logdir, _reason(e))
        else:
            log.warning("summaries to %s stopped: %s: %s (a bug; please report it); training goes on without them",
                        self.logdir, type(e).__name__, e, exc_info=e)


def _reason(e: OSError) -> str:
    """"No space left on device", for the log."""
    return e.strerror or errno.errorcode.get(e.errno or 0) or str(e)
