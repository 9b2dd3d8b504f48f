"""Helpers for the launcher's cluster tests: run `shoal` as a real process with its own
SHOAL_HOME, read the job records, and make sure nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import psutil

PROGRAMS = Path(__file__).resolve().parent
REPO = PROGRAMS.parents[1]
PY = sys.executable


def shoal_env(home: Path, **extra: str) -> dict:
    env = dict(os.environ, SHOAL_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    env.pop("TF_CONFIG", None)
    return env


def program(name: str) -> str:
    return str(PROGRAMS / name)


def start_shoal(home: Path, *args: str, cwd: Optional[Path] = None) -> subprocess.Popen:
    """Start `shoal ARGS` in its own session, stdout+stderr captured."""
    return subprocess.Popen(
        [PY, "-m", "shoal.cli.main", *args], cwd=str(cwd or REPO), env=shoal_env(home),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )


def run_shoal(home: Path, *args: str, timeout: float = 60,
              cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run `shoal ARGS` to completion (bounded)."""
    return subprocess.run(
        [PY, "-m", "shoal.cli.main", *args], cwd=str(cwd or REPO), env=shoal_env(home),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
    )


def run_ok(home: Path, *args: str, timeout: float = 60) -> str:
    """Run `shoal ARGS` (bounded), assert it exited 0 and return what it printed."""
    out = run_shoal(home, *args, timeout=timeout)
    text = out.stdout.decode()
    assert out.returncode == 0, text
    return text


def status(home: Path) -> list[dict]:
    """`shoal status --json`, parsed ([] before the first job is recorded)."""
    out = run_shoal(home, "status", "--json", timeout=30)
    assert out.returncode == 0, out.stdout.decode()
    return json.loads(out.stdout)


def only_job(home: Path) -> dict:
    """The one job recorded under `home`, as `shoal status --json` shows it."""
    [job] = status(home)
    return job


def task_log(home: Path, name: str) -> str:
    """What task `name` (e.g. "worker.0") of the job under `home` logged ("" before its log exists)."""
    logs = list(home.glob(f"jobs/*/logs/{name}.log"))
    return logs[0].read_text(errors="replace") if logs else ""


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """Poll `predicate` until it returns something truthy; AssertionError after timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def recorded_pids(home: Path) -> list[int]:
    """Every task pid the launcher recorded, over all jobs under `home`."""
    import sqlite3

    db = home / "jobs.db"
    if not db.exists():
        return []
    with sqlite3.connect(str(db), timeout=10) as conn:
        try:
            return [row[0] for row in conn.execute("SELECT pid FROM processes")]
        except sqlite3.OperationalError:  # the launcher has not created the tables yet
            return []


def grandchild_pids(home: Path) -> list[int]:
    """Pids printed as 'grandchild pid N' in any task log under `home`."""
    pids = []
    for log in home.glob("jobs/*/logs/*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("grandchild pid "):
                pids.append(int(line.split()[-1]))
    return pids


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (zombies count as dead)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def cleanup(home: Path, *procs: subprocess.Popen) -> None:
    """For `finally:` — kill the launchers (their groups) and every recorded task group."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if proc.stdout:
            proc.stdout.close()
    for pid in alive(recorded_pids(home)) + alive(grandchild_pids(home)):
        for kill in (os.killpg, os.kill):  # its group if it leads one, else itself
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def launcher_pids(home: Path) -> list[int]:
    """The launcher pid of every job recorded under `home` (detached launchers are no child of
    the test)."""
    import sqlite3

    db = home / "jobs.db"
    if not db.exists():
        return []
    with sqlite3.connect(str(db), timeout=10) as conn:
        try:
            return [row[0] for row in conn.execute("SELECT launcher_pid FROM jobs") if row[0]]
        except sqlite3.OperationalError:
            return []


def wait_nothing_left(home: Path) -> None:
    """Wait (15 s at most) until no task or launcher process recorded under `home` runs."""
    pids = recorded_pids(home) + launcher_pids(home)
    wait_for(lambda: not alive(pids), 15, f"every process of the job to end ({alive(pids)} still run)")


def cleanup_launchers(home: Path) -> None:
    """For `finally:` — SIGKILL the recorded launchers still running shoal (their tasks follow,
    by the parent-death signal and the watchdog), then what `cleanup` kills."""
    for pid in alive(launcher_pids(home)):
        try:
            if "shoal.cli.main" in " ".join(psutil.Process(pid).cmdline()):
                os.kill(pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError):
            pass
    cleanup(home)
