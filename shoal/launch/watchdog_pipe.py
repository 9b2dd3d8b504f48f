"""`WatchdogPipe`: the launcher's side of a watchdog process that cleans up after the launcher
however it dies. The launcher writes "+ID" / "-ID" lines on the watchdog's stdin as things to
clean up come and go; when the pipe closes — `close`, or the kernel closing it because the
launcher died, even by SIGKILL — the watchdog cleans up every ID still registered.

The local reaper (process groups, `reaper.py`) and the Slurm watchdog (steps and jobs,
`slurm_watchdog.py`) are the two watchdogs; each is a script run in its own session.

A watchdog that dies while the launcher runs (the OOM killer, a stray `kill`) would leave the
job unguarded: a later SIGKILL of the launcher would leave its tasks running. So a thread waits
on the watchdog process; if it exits before `close`, a new one is started and told every ID
still registered, and a warning says so (at most MAX_RESPAWNS times).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Optional

from shoal.wording import counted

log = logging.getLogger(__name__)

MAX_RESPAWNS = 5
"""How many times a watchdog that died is started again before the launcher gives up on it."""


class WatchdogPipe:
    """One watchdog process. The constructor does no I/O; `start` blocks for the fork/exec
    only; `add`/`remove` are thread-safe; `close` is idempotent and lets the watchdog exit,
    cleaning up only what was not removed."""

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
                 close_timeout: float = 5.0, kill_after_close: bool = True) -> None:
        self._argv = list(argv)
        self._env = dict(env) if env is not None else None
        self._close_timeout = close_timeout
        self._kill_after_close = kill_after_close
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._items: dict[str, None] = {}  # what is registered now, in order (a respawn tells them again)
        self.respawns = 0

    def start(self) -> None:
        with self._lock:
            self._spawn()

    def add(self, item: str) -> None:
        with self._lock:
            self._items[item] = None
            self._send(f"+{item}\n")

    def remove(self, item: str) -> None:
        with self._lock:
            self._items.pop(item, None)
            self._send(f"-{item}\n")

    def _spawn(self) -> None:
        """Start the watchdog process and a thread that waits on it; tell it what is registered
        (called with the lock held)."""
        proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=self._env, start_new_session=True)
        self._proc = proc
        if self._items:
            self._write(proc, "".join(f"+{item}\n" for item in self._items))
        threading.Thread(target=self._watch, args=(proc,), name="shoal-watchdog-pipe", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        """Wait for `proc` to exit; if it was not closed, start a new one (see the module)."""
        code = proc.wait()
        with self._lock:
            if self._proc is not proc:  # closed (or already replaced): as it should be
                return
            if self.respawns >= MAX_RESPAWNS:
                self._proc = None
                log.warning("the job's watchdog process (pid %d) died (exit %s) after %d replacements; the launcher"
                            " no longer replaces it, so if the launcher itself is killed, look for leftovers with"
                            " shoal check JOB --kill", proc.pid, code, self.respawns)
                return
            self.respawns += 1
            try:
                self._spawn()
            except OSError as e:  # (out of memory or processes: what may have killed the old one)
                self._proc = None
                log.warning("the job's watchdog process (pid %d) died (exit %s) and a new one could not be started"
                            " (%s); if the launcher itself is killed, look for leftovers with shoal check JOB --kill",
                            proc.pid, code, e)
                return
            log.warning("the job's watchdog process (pid %d) died (exit %s); started a new one (pid %d) and told it"
                        " the %s the old one watched", proc.pid, code, self._proc.pid,
                        counted(len(self._items), "thing"))

    def close(self, timeout: Optional[float] = None) -> None:
        """Close the pipe and wait (up to `timeout`, else the constructor's) for the watchdog to
        clean up and exit; kill it after that, unless the constructor said `kill_after_close`
        False (a watchdog that bounds its own retries: it goes on cleaning up on its own)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(self._close_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            if self._kill_after_close:
                proc.kill()
                proc.wait(5)

    def _send(self, line: str) -> None:
        """Write `line` to the watchdog (called with the lock held)."""
        if self._proc is not None:
            self._write(self._proc, line)

    @staticmethod
    def _write(proc: subprocess.Popen, text: str) -> None:
        """Write `text` to the watchdog; a watchdog that died meanwhile is replaced by `_watch`,
        which tells its successor everything registered."""
        if proc.stdin is None:
            return
        try:
            proc.stdin.write(text.encode())
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
