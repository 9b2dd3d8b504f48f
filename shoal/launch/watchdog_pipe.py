"""`WatchdogPipe`: the launcher's side of a watchdog process that cleans up after the launcher
however it dies. The launcher writes "+ID" / "-ID" lines on the watchdog's stdin as things to
clean up come and go; when the pipe closes — `close`, or the kernel closing it because the
launcher died, even by SIGKILL — the watchdog cleans up every ID still registered.

The local reaper (process groups, `reaper.py`) and the Slurm watchdog (steps and jobs,
`slurm_watchdog.py`) are the two watchdogs; each is a script run in its own session.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Optional


class WatchdogPipe:
    """One watchdog process. The constructor does no I/O; `start` blocks for the fork/exec
    only; `add`/`remove` are thread-safe; `close` is idempotent and lets the watchdog exit,
    cleaning up only what was not removed."""

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
                 close_timeout: float = 5.0) -> None:
        self._argv = list(argv)
        self._env = dict(env) if env is not None else None
        self._close_timeout = close_timeout
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=self._env, start_new_session=True)

    def add(self, item: str) -> None:
        self._send(f"+{item}\n")

    def remove(self, item: str) -> None:
        self._send(f"-{item}\n")

    def close(self, timeout: Optional[float] = None) -> None:
        """Close the pipe and wait (up to `timeout`, else the constructor's) for the watchdog to
        clean up and exit; kill it after that."""
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
            proc.kill()
            proc.wait(5)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
