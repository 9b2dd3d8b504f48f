"""`JobOutput` and `JobFollower`: a job's output read back from its files as they grow, until
the job is over (`shoal attach`, and `shoal train` in a terminal, which follows the background
launcher it started).

The source is the launcher's console file, `<job dir>/launcher.log`, when the job has one (a
detached launcher writes everything it prints there: task lines prefixed `name.role.index | `,
state changes, progress and the final summary); else each task's log, its whole lines prefixed
with the task's label as the launcher prints them (as `shoal logs -f` does). A job is over once
its record is in a final state and its launcher has exited (so its last lines are written), or
at most `_LAUNCHER_EXIT_WAIT` seconds after the final state. A file truncated meanwhile (`: >
worker.0.log`, logrotate's copytruncate) is read again from its start, after a line that says
so (log_reads.py).

File reads and records queries only (bounded); not thread-safe (one per follower).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from shoal.launch.control import launcher_alive, reconcile
from shoal.launch.executor import Executor
from shoal.launch.launcher_output import launcher_log_path
from shoal.launch.log_reads import read_new, truncated_note
from shoal.launch.records import JobRecord, JobStore

_POLL = 0.2
_LAUNCHER_EXIT_WAIT = 10.0
_MAX_READ = 1 << 20
"""Bytes read from one file per poll: a long log is caught up with in steps of bounded memory."""


class JobOutput:
    """New output of one job since the last `read` (whole lines; at the end, what is left)."""

    def __init__(self, job: JobRecord) -> None:
        launcher_log = launcher_log_path(job.job_dir)
        if launcher_log.exists():
            self._sources = [(launcher_log, b"")]
        else:
            self._sources = [(Path(t.log_path), t.label.encode() + b" | ") for t in job.tasks]
        self._offsets = [0] * len(self._sources)
        self.behind = False

    @property
    def files(self) -> list[Path]:
        """The files it reads."""
        return [path for path, _ in self._sources]

    def read(self, final: bool = False) -> bytes:
        """The whole lines written since the last call (with `final`, also a last line
        without its newline), each source's lines prefixed; at most about `_MAX_READ` bytes
        of each file (`behind` says whether more is waiting)."""
        out = []
        self.behind = False
        for i, (path, prefix) in enumerate(self._sources):
            data, self._offsets[i], more, truncated = _new_lines(path, self._offsets[i], final)
            self.behind = self.behind or more
            if truncated:
                out.append(f"shoal | {truncated_note(path)}\n".encode())
            if data:
                out.extend(prefix + line + b"\n" for line in data.split(b"\n"))
        return b"".join(out)


class JobFollower:
    """Copies a job's output to `write` until the job is over. `run` returns early when
    `interrupted()` turns true (a Ctrl-C seen by the caller's signal handler) and may be
    called again: it goes on where it stopped."""

    def __init__(self, store: JobStore, job: JobRecord, executor: Executor,
                 write: Callable[[bytes], None]) -> None:
        self._store = store
        self._job = job
        self._executor = executor
        self._write = write
        self._output = JobOutput(job)
        self._ended_at: float | None = None

    @property
    def job(self) -> JobRecord:
        """The job as last read from the records."""
        return self._job

    def run(self, interrupted: Callable[[], bool] = lambda: False) -> JobRecord | None:
        """Follow until the job is over and return its final record, or until `interrupted()`
        and return None. Blocks as long as the job runs (each poll is bounded)."""
        while not interrupted():
            self._emit(self._output.read())
            while self._output.behind:  # catching up with a long log: no pause between reads
                self._emit(self._output.read())
            self._job = reconcile(self._store, self._store.find(self._job.id), self._executor)
            if self._over():
                self._emit(self._output.read(final=True))
                while self._output.behind:
                    self._emit(self._output.read(final=True))
                self._job = self._store.find(self._job.id)
                return self._job
            time.sleep(_POLL)
        return None

    def _over(self) -> bool:
        if not self._job.state.is_terminal:
            return False
        now = time.monotonic()
        if self._ended_at is None:
            self._ended_at = now
        return not launcher_alive(self._job) or now - self._ended_at >= _LAUNCHER_EXIT_WAIT

    def _emit(self, data: bytes) -> None:
        if data:
            self._write(data)


def _new_lines(path: Path, offset: int, final: bool) -> tuple[bytes, int, bool, bool]:
    """The whole lines of `path` after `offset` (without the last newline), the new offset,
    whether more may be waiting, and whether the file was truncated (then the lines are from
    its start); with `final`, a last line without newline too. Reads at most `_MAX_READ` bytes
    (a line longer than that is cut)."""
    try:
        new = read_new(path, offset, _MAX_READ)
    except OSError:
        return b"", offset, False, False
    data, offset = new.data, new.offset
    end = data.rfind(b"\n") + 1
    if final or (end == 0 and len(data) == _MAX_READ):
        end = len(data)
    more = len(data) == _MAX_READ
    if end <= 0:
        return b"", offset, False, new.truncated
    chunk = data[:end]
    return (chunk[:-1] if chunk.endswith(b"\n") else chunk), offset + end, more, new.truncated
