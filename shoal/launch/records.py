"""`JobStore`: the job records, an SQLite file under $SHOAL_HOME (jobs.db).

The launcher writes a job's states, its tasks' states and every process it started; other
terminals read them (`shoal status`, `logs`, `kill`, `monitor`). Methods are thread-safe
(one connection behind a lock); SQLite's own locking makes several processes safe.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from shoal.launch.errors import JobNotFound
from shoal.launch.plan import JobPlan

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
  ended REAL, exit_code INTEGER, reason TEXT NOT NULL DEFAULT '',
  launcher_pid INTEGER, launcher_started REAL, job_dir TEXT NOT NULL,
  model_dir TEXT NOT NULL, step INTEGER, loss REAL
);
CREATE TABLE IF NOT EXISTS tasks (
  job_id TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, address TEXT NOT NULL,
  state TEXT NOT NULL, pid INTEGER, restarts INTEGER NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT '', log_path TEXT NOT NULL, position INTEGER NOT NULL,
  PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS processes (
  job_id TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER NOT NULL, started REAL
);
"""


@dataclass(frozen=True)
class TaskRecord:
    """One task as recorded: its latest state and process."""

    name: str
    label: str
    address: str
    state: str
    pid: Optional[int]
    restarts: int
    detail: str
    log_path: str

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ProcessRecord:
    """A process the launcher started (one per task attempt); `started` is its
    create time (psutil), to tell it from a later process that reuses the pid."""

    name: str
    pid: int
    started: Optional[float]


@dataclass(frozen=True)
class JobRecord:
    """One job as recorded."""

    id: str
    name: str
    state: str
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
    tasks: tuple[TaskRecord, ...]

    def task(self, name: str) -> TaskRecord:
        for task in self.tasks:
            if task.name == name:
                return task
        raise JobNotFound(
            f"job {self.id} has no task {name!r}; its tasks are"
            f" {', '.join(t.name for t in self.tasks)}"
        )

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "tasks"}
        out["tasks"] = [t.as_json() for t in self.tasks]
        return out


class JobStore:
    """The records database. `open` creates it if needed; `close` is idempotent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: Optional[sqlite3.Connection] = None
        self._lock = threading.Lock()

    def open(self) -> "JobStore":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; no fsync per write
        self._db.executescript(_SCHEMA)
        return self

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

    def create_job(self, plan: JobPlan, launcher_pid: int, launcher_started: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, name, state, created, launcher_pid, launcher_started,"
                " job_dir, model_dir) VALUES (?, ?, 'PENDING', ?, ?, ?, ?, ?)",
                (plan.job_id, plan.name, time.time(), launcher_pid, launcher_started,
                 plan.job_dir, plan.model_dir),
            )
            db.executemany(
                "INSERT INTO tasks (job_id, name, label, address, state, log_path, position)"
                " VALUES (?, ?, ?, ?, 'PENDING', ?, ?)",
                [(plan.job_id, t.name, t.label, t.address, t.log_path, i)
                 for i, t in enumerate(plan.tasks)],
            )

    def set_job_state(self, job_id: str, state: str, reason: str = "",
                      exit_code: Optional[int] = None, ended: bool = False) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, exit_code = COALESCE(?, exit_code),"
                " ended = CASE WHEN ? THEN ? ELSE ended END WHERE id = ?",
                (state, reason, exit_code, ended, time.time(), job_id),
            )

    def set_task(self, job_id: str, name: str, state: str, detail: str, restarts: int,
                 pid: Optional[int] = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET state = ?, detail = ?, restarts = ?, pid = COALESCE(?, pid)"
                " WHERE job_id = ? AND name = ?",
                (state, detail, restarts, pid, job_id, name),
            )

    def add_process(self, job_id: str, name: str, pid: int, started: Optional[float]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO processes VALUES (?, ?, ?, ?)", (job_id, name, pid, started))

    def set_progress(self, job_id: str, step: int, loss: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET step = ?, loss = ? WHERE id = ?", (step, loss, job_id))

    # --- reads (any terminal) -------------------------------------------------------

    def list_jobs(self) -> list[JobRecord]:
        """Every job, newest first."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created DESC, id DESC").fetchall()
            return [self._job(db, row) for row in rows]

    def find(self, ref: str) -> JobRecord:
        """The job whose id is `ref`, else the one id starting with `ref`, else the newest
        job named `ref`; JobNotFound otherwise."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (ref,)).fetchone()
            if row is None:
                rows = db.execute("SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\'",
                                  (_like_prefix(ref),)).fetchall()
                if len(rows) > 1:
                    raise JobNotFound(
                        f"job {ref!r} is ambiguous: it starts {len(rows)} job ids; give"
                        " more of the id (see shoal status)"
                    )
                row = rows[0] if rows else None
            if row is None:
                row = db.execute("SELECT * FROM jobs WHERE name = ? ORDER BY created DESC,"
                                 " id DESC LIMIT 1", (ref,)).fetchone()
            if row is None:
                raise JobNotFound(
                    f"no job {ref!r} in {self.path}; list the jobs with shoal status"
                    " (or set SHOAL_HOME to where the job ran)"
                )
            return self._job(db, row)

    def processes(self, job_id: str) -> list[ProcessRecord]:
        """Every process started for the job, in start order."""
        with self._tx() as db:
            rows = db.execute("SELECT name, pid, started FROM processes WHERE job_id = ?"
                              " ORDER BY rowid", (job_id,)).fetchall()
        return [ProcessRecord(*row) for row in rows]

    def _job(self, db: sqlite3.Connection, row: sqlite3.Row) -> JobRecord:
        data = dict(row)
        tasks = db.execute(
            "SELECT name, label, address, state, pid, restarts, detail, log_path FROM tasks"
            " WHERE job_id = ? ORDER BY position", (data["id"],),
        ).fetchall()
        return JobRecord(**data, tasks=tuple(TaskRecord(*t) for t in tasks))

    def _tx(self) -> "_Tx":
        if self._db is None:
            raise RuntimeError("JobStore.open() first")
        return _Tx(self._db, self._lock)


class _Tx:
    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db, self._lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        self._db.row_factory = sqlite3.Row
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self._lock.release()


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
