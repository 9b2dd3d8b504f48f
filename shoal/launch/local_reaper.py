"""`Reaper`: the launcher's side of the job's watchdog process (`reaper.py`), which kills
every registered process group when the launcher dies, however it dies.

The launcher writes "+PGID" / "-PGID" lines as task groups come and go (`WatchdogPipe`). When
the pipe closes — `close`, or the kernel closing it because the launcher died — the reaper stops
every group still registered: TERM, then KILL after the grace period.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shoal.launch.watchdog_pipe import WatchdogPipe

_SCRIPT = Path(__file__).with_name("reaper.py")


class Reaper(WatchdogPipe):
    """The job's watchdog process (see WatchdogPipe). `add`/`remove` take process group ids."""

    def __init__(self, grace: float = 2.0) -> None:
        super().__init__([sys.executable, "-I", str(_SCRIPT), str(grace)])

    def add(self, pgid: int) -> None:  # type: ignore[override]
        super().add(str(int(pgid)))

    def remove(self, pgid: int) -> None:  # type: ignore[override]
        super().remove(str(int(pgid)))
