"""The schema of the job records (jobs.db), its version, and the migrations that bring an
older file up to date when a newer shoal opens it.

The version is SQLite's `PRAGMA user_version`. Version 0 is the first, unversioned
schema; version 1 records each job's executor kind and, per started process, the
executor's TaskRef (JSON) instead of a bare pid; version 2 gives each job a short number
(1, 2, 3 ... in creation order, never given twice: `counters` holds the last one) and each
task the summaries directory it reported; version 3 keeps each task's latest straggler figures
from its progress lines (median and p95 step time in ms, gradients applied of pushed, and
when its last progress line came); version 4 keeps each job's ps membership as ps:0 last logged it
(version, the tasks training, what changed, when: shoal/launch/membership_line.py) — tasks
added by `shoal scale` are rows like the others, a scaled-down one in state SCALED_DOWN.
A migration runs inside one write transaction,
so two shoal processes opening an old file at once migrate it once.
"""

from __future__ import annotations

import sqlite3

from shoal.launch.errors import WorkspaceError
from shoal.launch.executor import TaskRef

SCHEMA_VERSION = 4

_JOBS = """CREATE TABLE jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
  ended REAL, exit_code INTEGER, reason TEXT NOT NULL DEFAULT '',
  launcher_pid INTEGER, launcher_started REAL, job_dir TEXT NOT NULL,
  model_dir TEXT NOT NULL, step INTEGER, loss REAL, executor TEXT NOT NULL DEFAULT 'local',
  number INTEGER,
  membership_version INTEGER, membership_tasks TEXT, membership_change TEXT, membership_at REAL
)"""
_TASKS = """CREATE TABLE tasks (
  job_id TEXT NOT NULL, name TEXT NOT NULL, label TEXT NOT NULL, address TEXT NOT NULL,
  state TEXT NOT NULL, pid INTEGER, restarts INTEGER NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT '', log_path TEXT NOT NULL, position INTEGER NOT NULL,
  summaries TEXT NOT NULL DEFAULT '',
  step_ms REAL, p95_ms REAL, applied INTEGER, pushed INTEGER, progress_at REAL,
  PRIMARY KEY (job_id, name)
)"""
_PROCESSES = """CREATE TABLE {name} (
  job_id TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER, started REAL, ref TEXT NOT NULL
)"""
_COUNTERS = "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
_NUMBER_INDEX = "CREATE UNIQUE INDEX jobs_number ON jobs (number)"
JOB_NUMBER = "job_number"
"""The counter (in `counters`) that holds the last job number given."""


def ensure_schema(db: sqlite3.Connection, path: object) -> bool:
    """Create the tables in a new file, or migrate an older one to SCHEMA_VERSION. Returns
    whether this call created them (a new, or emptied, file). `db` is in autocommit mode
    (isolation_level=None). Blocks on SQLite's write lock."""
    if _version(db) == SCHEMA_VERSION:
        return False
    created = False
    db.execute("BEGIN IMMEDIATE")
    try:
        version = _version(db)  # again, under the lock: another process may have done it
        if version > SCHEMA_VERSION:
            raise WorkspaceError(
                f"the job records {path} were written by a newer shoal (schema {version},"
                f" this one knows {SCHEMA_VERSION}); use that shoal, or set SHOAL_HOME"
                " elsewhere"
            )
        if version < SCHEMA_VERSION:
            if not _has_table(db, "jobs"):
                for statement in (_JOBS, _TASKS, _PROCESSES.format(name="processes"),
                                  _COUNTERS, _NUMBER_INDEX):
                    db.execute(statement)
                db.execute("INSERT INTO counters VALUES (?, 0)", (JOB_NUMBER,))
                created = True
            else:
                if version < 1:
                    _migrate_0_to_1(db)
                if version < 2:
                    _migrate_1_to_2(db)
                if version < 3:
                    _migrate_2_to_3(db)
                _migrate_3_to_4(db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return created


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    """Jobs get an executor column (all old jobs ran locally); processes get a TaskRef
    and a nullable pid (a task elsewhere may have none), so that table is rebuilt."""
    db.execute("ALTER TABLE jobs ADD COLUMN executor TEXT NOT NULL DEFAULT 'local'")
    db.execute(_PROCESSES.format(name="processes_v1"))
    rows = db.execute("SELECT job_id, name, pid, started FROM processes ORDER BY rowid")
    db.executemany(
        "INSERT INTO processes_v1 VALUES (?, ?, ?, ?, ?)",
        [(job_id, name, pid, started, TaskRef("local", pid=pid, started=started).to_json())
         for job_id, name, pid, started in rows.fetchall()],
    )
    db.execute("DROP TABLE processes")
    db.execute("ALTER TABLE processes_v1 RENAME TO processes")


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Jobs get numbers in creation order (oldest 1), tasks an empty summaries directory."""
    db.execute("ALTER TABLE jobs ADD COLUMN number INTEGER")
    db.execute("ALTER TABLE tasks ADD COLUMN summaries TEXT NOT NULL DEFAULT ''")
    ids = [row[0] for row in db.execute("SELECT id FROM jobs ORDER BY created, id")]
    db.executemany("UPDATE jobs SET number = ? WHERE id = ?",
                   [(number, job_id) for number, job_id in enumerate(ids, start=1)])
    db.execute(_NUMBER_INDEX)
    db.execute(_COUNTERS)
    db.execute("INSERT INTO counters VALUES (?, ?)", (JOB_NUMBER, len(ids)))


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Tasks get empty straggler figures."""
    for column in _FIGURE_COLUMNS:
        db.execute(f"ALTER TABLE tasks ADD COLUMN {column}")


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """Jobs get an empty membership."""
    for column in _MEMBERSHIP_COLUMNS:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column}")


_MEMBERSHIP_COLUMNS = ("membership_version INTEGER", "membership_tasks TEXT",
                       "membership_change TEXT", "membership_at REAL")
_FIGURE_COLUMNS = ("step_ms REAL", "p95_ms REAL", "applied INTEGER", "pushed INTEGER",
                   "progress_at REAL")


def _version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                     (name,)).fetchone()
    return row is not None
