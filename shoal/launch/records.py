"""`JobStore`: the job records, an SQLite file under $SHOAL_HOME (jobs.db).

The launcher writes a job's states, its tasks' states and every process it started (as
its executor's TaskRef); other terminals read them (`shoal status`, `logs`, `kill`,
`monitor`). Each job gets a short number (1, 2, 3 ...; `find("12")`) when it is
recorded. States come back as TaskState / JobState. Methods are thread-safe (one
connection behind a lock); SQLite's own locking makes several processes safe. The file
and its WAL/SHM files are 0600, a directory created for them 0700. The schema is
versioned; `open` migrates an older file (records_schema.py).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from shoal.launch.errors import JobNotFound, LaunchError, WorkspaceError
from shoal.launch.executor import TaskRef
from shoal.launch.files import private_dirs, private_file, tighten_file
from shoal.launch.records_errors import records_failure
from shoal.launch.plan import JobPlan, TaskPlan
from shoal.launch.records_schema import JOB_NUMBER, ensure_schema
from shoal.launch.states import JobState, TaskState

_PRIVATE_SIDE_FILES = ("-wal", "-shm")


@dataclass(frozen=True)
class TaskRecord:
    """One task as recorded: its latest state and process."""

    name: str
    label: str
    address: str
    state: TaskState
    pid: Optional[int]
    restarts: int
    detail: str
    log_path: str
    summaries: str = ""
    """The TensorBoard directory the task reported ("" if none), on the task's host."""
    step_ms: Optional[float] = None
    """Median wall time of its recent local steps (ms), from its latest progress line."""
    p95_ms: Optional[float] = None
    """95th percentile of the same."""
    applied: Optional[int] = None
    """Of the `pushed` gradients it pushed so far, how many the ps applied (the rest were dropped)."""
    pushed: Optional[int] = None
    progress_at: Optional[float] = None
    """When (time.time()) its latest progress line came; None if it printed none."""

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "state": self.state.value}


@dataclass(frozen=True)
class ProcessRecord:
    """One task attempt the launcher started, as its executor's reference."""

    name: str
    ref: TaskRef


@dataclass(frozen=True)
class JobRecord:
    """One job as recorded."""

    id: str
    name: str
    state: JobState
    created: float
    ended: Optional[float]
    exit_code: Optional[int]
    reason: str
    launcher_pid: Optional[int]
    launcher_started: Optional[float]
    job_dir: str
    model_dir: str
    step: Optional[int]
    loss: Optional[float]
    executor: str
    number: Optional[int]
    """The job's short number (`shoal logs 12`); None only for a job being migrated."""
    tasks: tuple[TaskRecord, ...]
    membership_version: Optional[int] = None
    """The ps membership's version as ps:0 last logged it (None: it logged none)."""
    membership_tasks: Optional[str] = None
    """The tasks training in it, as logged: "chief:0, worker:0"."""
    membership_change: Optional[str] = None
    """What changed last, as logged: "worker:1 left (no heartbeat for 20s)" ("" if nothing said)."""
    membership_at: Optional[float] = None
    """When (time.time()) that line came."""

    @property
    def members(self) -> tuple[str, ...]:
        """The tasks training, as task names ("worker.1"); () when no membership is recorded."""
        if not self.membership_tasks:
            return ()
        return tuple(word.strip().replace(":", ".") for word in self.membership_tasks.split(",")
                     if word.strip())

    @property
    def handle(self) -> str:
        """How tables and messages name the job: "12 mnist-20260101-120000-ab12"."""
        return f"{self.number} {self.id}" if self.number is not None else self.id

    def task(self, name: str) -> TaskRecord:
        for task in self.tasks:
            if task.name == name:
                return task
        raise JobNotFound(
            f"job {self.id} has no task {name!r}; its tasks are"
            f" {', '.join(t.name for t in self.tasks)}"
        )

    def as_json(self) -> dict[str, Any]:
        """What `shoal status --json` prints (the executor kind is internal for now)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("tasks", "executor")}
        out["state"] = self.state.value
        out["tasks"] = [t.as_json() for t in self.tasks]
        return out


class JobStore:
    """The records database. `open` creates it if needed; `close` is idempotent. `note(text)`
    is told when `open` finds the records new but job folders beside them from before (the
    file was emptied or replaced): those jobs are not listed, and numbers start again at 1."""

    def __init__(self, path: Path, note: Optional[Callable[[str], None]] = None) -> None:
        self.path = path
        self._note = note
        self._db: Optional[sqlite3.Connection] = None
        self._lock = threading.Lock()

    def open(self) -> "JobStore":
        """Create or open the file (migrating an older schema); WorkspaceError if it
        cannot be. Blocks on SQLite's locks."""
        fix = "set SHOAL_HOME to a writable directory (default ~/.shoal)"
        private_dirs(self.path.parent, "the folder of the job records", fix)
        private_file(self.path, "the job records", fix)
        for suffix in _PRIVATE_SIDE_FILES:  # left 0644 by an older shoal
            tighten_file(self.path.with_name(self.path.name + suffix), "the job records", fix)
        try:
            db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False,
                                 isolation_level=None)
        except sqlite3.Error as e:
            raise records_failure(self.path, e) from e
        try:
            created = _prepare(db, self.path)
        except sqlite3.Error as e:
            db.close()
            raise records_failure(self.path, e) from e
        except BaseException:
            db.close()
            raise
        self._db = db
        if created and self._note is not None:
            self._say_unrecorded_folders()
        return self

    def _say_unrecorded_folders(self) -> None:
        """Tell `note` of the job folders from before that new records do not list."""
        jobs = self.path.parent / "jobs"
        try:
            # a job that ran has its logs folder (one starting now may have its folder already, not that)
            folders = sorted(p.name for p in jobs.iterdir() if (p / "logs").is_dir())
        except OSError:
            return
        if folders:
            with suppress(OSError):  # a note that cannot be said (a closed stderr) costs nothing else
                self._note(f"shoal: the job records {self.path} are new, but {jobs} holds {len(folders)} job folder(s)"
                           f" from before ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''}): the records"
                           " were emptied or replaced, so those jobs are not listed and job numbers start again at 1;"
                           " their logs are still in their folders (delete the ones you do not need)")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> "JobStore":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes (the launcher) ------------------------------------------------------

    def create_job(self, plan: JobPlan, launcher_pid: int, launcher_started: float,
                   executor: str = "local") -> int:
        """Record a new job PENDING, run by `executor` (its kind) from the launcher
        process `launcher_pid` created at `launcher_started`; returns its number (one more
        than the last number given, even if that job was deleted). A job recorded while it
        waited in a queue (`create_queued`) keeps its record and number and gets its tasks."""
        with self._tx() as db:
            queued = db.execute("SELECT number FROM jobs WHERE id = ? AND state = 'PENDING'",
                                (plan.job_id,)).fetchone()
            if queued is not None:
                number = int(queued[0])
                db.execute("UPDATE jobs SET reason = '', job_dir = ?, model_dir = ? WHERE id = ?",
                           (plan.job_dir, plan.model_dir, plan.job_id))
            else:
                number = self._insert_job(db, plan.job_id, plan.name, launcher_pid, launcher_started,
                                          plan.job_dir, plan.model_dir, executor, "")
            db.executemany(
                "INSERT INTO tasks (job_id, name, label, address, state, log_path, position)"
                " VALUES (?, ?, ?, ?, 'PENDING', ?, ?)",
                [(plan.job_id, t.name, t.label, t.address, t.log_path, i)
                 for i, t in enumerate(plan.tasks)],
            )
        return number

    def create_queued(self, job_id: str, name: str, job_dir: str, launcher_pid: int,
                      launcher_started: float, executor: str, reason: str) -> int:
        """Record a job PENDING before it has tasks: its executor waits in a scheduler's queue
        (`reason` says how it waits), so other terminals see it and `shoal kill` reaches its
        launcher; `create_job` completes it. Returns its number."""
        with self._tx() as db:
            return self._insert_job(db, job_id, name, launcher_pid, launcher_started, job_dir, "", executor, reason)

    def _insert_job(self, db: sqlite3.Connection, job_id: str, name: str, launcher_pid: int,
                    launcher_started: float, job_dir: str, model_dir: str, executor: str, reason: str) -> int:
        db.execute("UPDATE counters SET value = value + 1 WHERE name = ?", (JOB_NUMBER,))
        number = int(db.execute("SELECT value FROM counters WHERE name = ?", (JOB_NUMBER,)).fetchone()[0])
        db.execute(
            "INSERT INTO jobs (id, name, state, created, launcher_pid, launcher_started,"
            " job_dir, model_dir, executor, number, reason)"
            " VALUES (?, ?, 'PENDING', ?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, name, time.time(), launcher_pid, launcher_started, job_dir, model_dir, executor, number,
             reason),
        )
        return number

    def add_task(self, job_id: str, task: TaskPlan) -> None:
        """Record a task added to the running job (`shoal scale`), PENDING, after the others."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO tasks (job_id, name, label, address, state, log_path, position)"
                " VALUES (?, ?, ?, ?, 'PENDING', ?,"
                " (SELECT COALESCE(MAX(position), -1) + 1 FROM tasks WHERE job_id = ?))",
                (job_id, task.name, task.label, task.address, task.log_path, job_id))

    def set_membership(self, job_id: str, version: int, tasks: str, change: str, at: float) -> None:
        """Record the job's ps membership from ps:0's latest membership line (the latest line
        wins, also one with a lower version: a restarted ps:0 counts again from its start)."""
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET membership_version = ?, membership_tasks = ?, membership_change = ?,"
                " membership_at = ? WHERE id = ?", (version, tasks, change, at, job_id))

    def set_job_state(self, job_id: str, state: JobState, reason: str = "",
                      exit_code: Optional[int] = None, ended: bool = False) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, exit_code = COALESCE(?, exit_code),"
                " ended = CASE WHEN ? THEN ? ELSE ended END WHERE id = ?",
                (JobState(state).value, reason, exit_code, ended, time.time(), job_id),
            )

    def set_exit_code(self, job_id: str, exit_code: int) -> None:
        """Record the exit code `shoal` returned for the job."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET exit_code = ? WHERE id = ?", (exit_code, job_id))

    def set_task(self, job_id: str, name: str, state: TaskState, detail: str, restarts: int,
                 ref: Optional[TaskRef] = None) -> None:
        """Record a task's state; `ref`, when given, is its current attempt."""
        pid = ref.pid if ref is not None else None
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET state = ?, detail = ?, restarts = ?, pid = COALESCE(?, pid)"
                " WHERE job_id = ? AND name = ?",
                (TaskState(state).value, detail, restarts, pid, job_id, name),
            )

    def add_process(self, job_id: str, name: str, ref: TaskRef) -> None:
        """Record one started attempt of task `name`."""
        with self._tx() as db:
            db.execute("INSERT INTO processes VALUES (?, ?, ?, ?, ?)",
                       (job_id, name, ref.pid, ref.started, ref.to_json()))

    def set_progress(self, job_id: str, step: int, loss: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET step = ?, loss = ? WHERE id = ?", (step, loss, job_id))

    def set_task_progress(self, job_id: str, name: str, step_ms: Optional[float],
                          p95_ms: Optional[float], applied: Optional[int], pushed: Optional[int],
                          at: float) -> None:
        """Record task `name`'s straggler figures from its latest progress line (a figure the
        line did not carry keeps its recorded value)."""
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET step_ms = COALESCE(?, step_ms), p95_ms = COALESCE(?, p95_ms),"
                " applied = COALESCE(?, applied), pushed = COALESCE(?, pushed), progress_at = ?"
                " WHERE job_id = ? AND name = ?",
                (step_ms, p95_ms, applied, pushed, at, job_id, name))

    def set_summaries(self, job_id: str, name: str, directory: str) -> None:
        """Record the TensorBoard directory task `name` reported writing to."""
        with self._tx() as db:
            db.execute("UPDATE tasks SET summaries = ? WHERE job_id = ? AND name = ?",
                       (directory, job_id, name))

    def delete_job(self, job_id: str) -> None:
        """Forget the job: its record, its tasks' and its processes' (files are the
        caller's). Its number is not given again. Idempotent."""
        with self._tx() as db:
            for table, column in (("processes", "job_id"), ("tasks", "job_id"), ("jobs", "id")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    # --- reads (any terminal) -------------------------------------------------------

    def list_jobs(self) -> list[JobRecord]:
        """Every job, newest first."""
        with self._tx() as db:
            rows = db.execute(f"SELECT * FROM jobs {_NEWEST_FIRST}").fetchall()
            return [self._job(db, row) for row in rows]

    def has(self, job_id: str) -> bool:
        """Whether a job with exactly this id is recorded."""
        with self._tx() as db:
            return db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None

    def newest(self) -> JobRecord:
        """The newest job; JobNotFound if there is none."""
        with self._tx() as db:
            row = db.execute(f"SELECT * FROM jobs {_NEWEST_FIRST} LIMIT 1").fetchone()
            if row is None:
                raise JobNotFound(f"no jobs yet in {self.path}; start one with shoal train"
                                  " SPEC.yaml or shoal run (or set SHOAL_HOME to where the"
                                  " jobs ran)")
            return self._job(db, row)

    def find(self, ref: str) -> JobRecord:
        """The job `ref` names, tried in this order: its id; its number (digits only); its
        name (the newest job of that name); the one id that starts with `ref`.
        JobNotFound if none matches, or if `ref` starts several ids (they are named)."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (ref,)).fetchone()
            if row is None and ref.isdigit() and ref.isascii():
                row = db.execute("SELECT * FROM jobs WHERE number = ?", (int(ref),)).fetchone()
            if row is None:
                row = db.execute(f"SELECT * FROM jobs WHERE name = ? {_NEWEST_FIRST} LIMIT 1",
                                 (ref,)).fetchone()
            if row is None:
                rows = db.execute(f"SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\'"
                                  f" {_NEWEST_FIRST}", (_like_prefix(ref),)).fetchall()
                if len(rows) > 1:
                    shown = ", ".join(f"{r['number']} {r['id']}" for r in rows[:_AMBIGUOUS_SHOWN])
                    more = f" and {len(rows) - _AMBIGUOUS_SHOWN} more" if len(rows) > _AMBIGUOUS_SHOWN else ""
                    raise JobNotFound(
                        f"job {ref!r} is ambiguous: it starts {len(rows)} job ids ({shown}{more});"
                        " give the job's number, its name (its newest job) or more of the id"
                    )
                row = rows[0] if rows else None
            if row is None:
                raise JobNotFound(
                    f"no job {ref!r} in {self.path}; list the jobs with shoal status"
                    " (or set SHOAL_HOME to where the job ran)"
                )
            return self._job(db, row)

    def processes(self, job_id: str) -> list[ProcessRecord]:
        """Every task attempt started for the job, in start order."""
        with self._tx() as db:
            rows = db.execute("SELECT name, ref FROM processes WHERE job_id = ?"
                              " ORDER BY rowid", (job_id,)).fetchall()
        try:
            return [ProcessRecord(name, TaskRef.from_json(ref)) for name, ref in rows]
        except LaunchError as e:
            raise LaunchError(f"job {job_id}: {e}") from e

    def _job(self, db: sqlite3.Connection, row: sqlite3.Row) -> JobRecord:
        data = dict(row)
        tasks = db.execute(
            "SELECT name, label, address, state, pid, restarts, detail, log_path, summaries,"
            " step_ms, p95_ms, applied, pushed, progress_at FROM tasks"
            " WHERE job_id = ? ORDER BY position", (data["id"],),
        ).fetchall()
        try:
            data["state"] = JobState(data["state"])
            return JobRecord(**data, tasks=tuple(
                TaskRecord(t[0], t[1], t[2], TaskState(t[3]), *t[4:]) for t in tasks))
        except (ValueError, TypeError) as e:  # a row changed by hand, or by a newer shoal
            job = data.get("id")
            raise WorkspaceError(
                f"the record of job {job} in {self.path} is damaged ({e}); the other jobs' records are not:"
                f" remove this one with sqlite3 {self.path} \"DELETE FROM processes WHERE job_id = '{job}';"
                f" DELETE FROM tasks WHERE job_id = '{job}'; DELETE FROM jobs WHERE id = '{job}'\"") from e

    def _tx(self) -> "_Tx":
        if self._db is None:
            raise RuntimeError("JobStore.open() first")
        return _Tx(self._db, self._lock, self.path)


_BUSY_RETRY_S = 10.0
"""How long `open` tries again while another process sets the file up: switching to WAL takes
a lock SQLite's busy timeout does not wait for, so two shoal commands that open a new file at
once could see "database is locked"."""


def _prepare(db: sqlite3.Connection, path: Path) -> bool:
    """WAL mode and the current schema (records_schema.py); whether the tables were created
    now. Blocks; tries again while another process holds the file's lock (at most
    _BUSY_RETRY_S), then raises sqlite3.Error."""
    deadline = time.monotonic() + _BUSY_RETRY_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; no fsync per write
            return ensure_schema(db, path)
        except sqlite3.OperationalError as e:
            busy = (getattr(e, "sqlite_errorname", "") or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
            if not busy or time.monotonic() >= deadline:
                raise
            if db.in_transaction:
                db.execute("ROLLBACK")
            time.sleep(0.05)


class _Tx:
    """One transaction, under the store's lock; an SQLite error in it (a full disk, a damaged
    file) leaves as the WorkspaceError records_failure makes."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, path: Path) -> None:
        self._db, self._lock, self._path = db, lock, path

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self._lock.release()
            raise records_failure(self._path, e) from e
        except BaseException:  # (a KeyboardInterrupt while BEGIN waits on another writer, too)
            self._lock.release()
            raise
        return self._db

    def __exit__(self, exc_type: object, exc: object, _tb: object) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type else "COMMIT")
        except sqlite3.Error as e:
            if exc_type is None:  # the COMMIT failed (a full disk): the change is not recorded
                raise records_failure(self._path, e) from e
            # a ROLLBACK that failed after an error: the first error says more
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise records_failure(self._path, exc) from exc


_NEWEST_FIRST = "ORDER BY created DESC, id DESC"
_AMBIGUOUS_SHOWN = 5


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
