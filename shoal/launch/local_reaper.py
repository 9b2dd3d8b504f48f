"""`Reaper`: the launcher's side of the job's watchdog process (`reaper.py`), which kills
every registered process group when the launcher dies, however it dies.

The reaper holds the read end of a pipe from the launcher; the launcher writes "+PGID" /
"-PGID" lines as task groups come and go. When the pipe closes — `close`, or the kernel
closing it because the launcher died — the reaper stops every group still registered.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

_SCRIPT = Path(__file__).with_name("reaper.py")


class Reaper:
    """The job's watchdog process. `add`/`remove` are thread-safe; `close` is idempotent
    and lets the reaper exit without killing anything that was removed."""

    def __init__(self, grace: float = 2.0) -> None:
        self._grace = grace
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the watchdog; blocks for the fork/exec only."""
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(_SCRIPT), str(self._grace)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def remove(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def close(self, timeout: float = 5.0) -> None:
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
            proc.wait(timeout)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
