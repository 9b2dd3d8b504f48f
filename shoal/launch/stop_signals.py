"""`StopSignals`: the launcher's handler of SIGINT and SIGTERM while a job runs.

The first signal asks the supervisor to stop the job (each task: SIGTERM, the grace period,
SIGKILL), with a reason that says who asked: `stopped by shoal kill` when `shoal kill` left its
mark (kill_request.py), else the signal's name. A second one skips the grace period (the
supervisor says so). But one Ctrl-C often arrives twice: `timeout 2h shoal train ...` forwards
the SIGINT its process group got to shoal, which got it too; such an echo, within `ECHO_S` of
the first, is not a second request.

Called from a signal handler on the main thread: it only sets the supervisor's flags (it
prints nothing: the output's lock may be held by the code it interrupted); does not block.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from shoal.launch.kill_request import kill_requested_by

ECHO_S = 0.5
"""A stop signal this soon after the previous one is the same request, delivered twice."""


class StopSignals:
    """The handler: `request_stop(reason)` as Supervisor.request_stop (a second call skips the
    grace period)."""

    def __init__(self, job_dir: str | Path, request_stop: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._job_dir = job_dir
        self._request_stop = request_stop
        self._clock = clock
        self._last: float | None = None

    def __call__(self, signum: int, _frame: object = None) -> None:
        now, name = self._clock(), signal.Signals(signum).name
        if self._last is not None and now - self._last < ECHO_S:
            return  # the same stop, delivered twice
        first = self._last is None
        self._last = now
        if first:
            by = kill_requested_by(self._job_dir) if signum == signal.SIGTERM else None
            self._request_stop(f"stopped by {by}" if by else f"the launcher got {name}")
            return
        self._request_stop(f"the launcher got {name} twice")
