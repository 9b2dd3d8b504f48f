"""`SlurmReaper`: the launcher's side of the Slurm watchdog (`slurm_watchdog.py`), which
scancels every registered step and job when the launcher dies, however it dies.

The watchdog holds the read end of a pipe from the launcher; `add` and `remove` write "+ID" /
"-ID" lines as steps start and end and jobs are submitted and cancelled. When the pipe closes
— `close`, or the kernel closing it because the launcher died — the watchdog scancels every
id still registered.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from shoal.launch.slurm import check_step_id

_SCRIPT = Path(__file__).with_name("slurm_watchdog.py")


class SlurmReaper:
    """The job's Slurm watchdog. The constructor does no I/O; `start` starts the process
    (blocks for the fork/exec only); `add`/`remove` are thread-safe; `close` is idempotent
    and lets the watchdog exit, cancelling only what was not removed."""

    def __init__(self, env: Mapping[str, str], python: str = sys.executable) -> None:
        self._env = dict(env)
        self._python = python
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._proc = subprocess.Popen([self._python, "-I", str(_SCRIPT)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self._env,
                                      start_new_session=True)

    def add(self, slurm_id: str) -> None:
        """Cancel job or step `slurm_id` ("12", "12.3") if the launcher dies."""
        self._send(f"+{check_step_id(slurm_id)}\n")

    def remove(self, slurm_id: str) -> None:
        self._send(f"-{check_step_id(slurm_id)}\n")

    def close(self, timeout: float = 70.0) -> None:
        """Close the pipe and wait for the watchdog (it scancels what is still registered)."""
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
            proc.wait(timeout)
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
