"""`BackgroundLauncher`: runs `shoal train/run ...` as a launcher of its own, in the background —
its own session (no terminal: Ctrl-C and a closed terminal never reach it), stdin from
/dev/null, its whole console into `<job dir>/launcher.log` — under a job id chosen beforehand,
so the command that started it can name the job at once (`--detach`), or follow it and leave
it running (`shoal train` in a terminal: Ctrl-C offers to detach).

The background launcher is an ordinary foreground launcher otherwise: same records, same
teardown, tasks tied to it by the parent-death signal and its watchdog; `shoal kill` stops it.
Blocking where it waits (bounded); not thread-safe (one per command).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Optional

import psutil

from shoal.launch.errors import JobNotFound, StartError
from shoal.launch.launcher_output import open_launcher_log
from shoal.launch.processes import same_process
from shoal.launch.records import JobRecord, JobStore

BACKGROUND_FLAG = "--background-job-id"
"""The hidden flag that tells `shoal train/run` to run in the foreground as the background
launcher of the job id that follows it."""

_POLL = 0.05


class Started(Enum):
    """How far a background launcher got within the wait."""

    RECORDED = "recorded"   # the job is in the records: it runs (or ran) under its id
    EXITED = "exited"       # the launcher ended before recording the job (an error; see its log)
    STARTING = "starting"   # still preparing (a slow allocation) when the wait ended


def background_argv(argv: Sequence[str], command: str, job_id: str) -> list[str]:
    """`argv` (shoal's arguments, "train spec.yaml --detach ...") with the hidden flag naming
    `job_id` put right after the subcommand `command` — before any `--`, so a program's own
    arguments are never touched."""
    args = list(argv)
    at = args.index(command) + 1
    return [*args[:at], BACKGROUND_FLAG, job_id, *args[at:]]


class BackgroundLauncher:
    """One background launcher: `python -m shoal.cli.main ARGV` (ARGV from `background_argv`)
    run with `environ` in `cwd`, its output appended to `log_path`. The constructor does no
    I/O; `start` forks; `wait_started` polls the records."""

    def __init__(self, argv: Sequence[str], *, python: str, environ: Mapping[str, str], cwd: Path,
                 log_path: Path) -> None:
        self._argv = [python, "-m", "shoal.cli.main", *argv]
        self._environ = dict(environ)
        self._cwd = cwd
        self.log_path = log_path
        self._proc: Optional[subprocess.Popen] = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, "start() first"
        return self._proc.pid

    def start(self) -> None:
        """Start the launcher in a new session; StartError if it cannot be. Blocks for the
        fork/exec only."""
        log = open_launcher_log(self.log_path)
        try:
            self._proc = subprocess.Popen(
                self._argv, cwd=self._cwd, env=self._environ, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        except OSError as e:
            raise StartError(f"cannot start the background launcher {self._argv[0]!r}: {e.strerror or e};"
                             " check the Python that runs shoal") from e
        finally:
            os.close(log)

    def wait_started(self, store: JobStore, job_id: str, timeout: float) -> Started:
        """Wait until job `job_id` is recorded, the launcher exits, or `timeout` seconds pass.
        Blocks (bounded by `timeout`)."""
        assert self._proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            if _recorded(store, job_id):
                return Started.RECORDED
            if self._proc.poll() is not None:
                return Started.RECORDED if _recorded(store, job_id) else Started.EXITED
            if time.monotonic() >= deadline:
                return Started.STARTING
            time.sleep(_POLL)

    def terminate(self) -> None:
        """SIGTERM to the launcher (it stops whatever it started); idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    @property
    def exit_code(self) -> Optional[int]:
        """The launcher's exit code once it ended, else None."""
        return None if self._proc is None else self._proc.poll()

    def output(self) -> str:
        """What the launcher wrote so far (its log file)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def signal_launcher(job: JobRecord, sig: int = signal.SIGTERM) -> bool:
    """Send `sig` to the launcher of `job` if it still runs (SIGTERM: stop the job — TERM,
    grace, KILL of each task —; a second SIGTERM skips the grace). Returns whether it was
    sent. Thread-safe; never blocks."""
    launcher = same_process(job.launcher_pid, job.launcher_started)
    if launcher is None:
        return False
    try:
        launcher.send_signal(sig)
    except psutil.Error:
        return False
    return True


def _recorded(store: JobStore, job_id: str) -> bool:
    try:
        return store.find(job_id).id == job_id
    except JobNotFound:
        return False
