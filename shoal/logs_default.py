"""Shoal's own log lines on stderr when the program set up no logging.

Python shows only WARNING and above of a program that never configured `logging`, so a worker
waiting for its ps, or resuming from a checkpoint, would say nothing. `show_shoal_logs()` is
called when a `TrainingSession` or a `shoal.Server` starts. It adds one handler, to the `shoal`
logger only, and only when neither the root logger nor the `shoal` logger has a handler (the
program configured nothing); then the `shoal` logger's level becomes INFO if it was unset.

It never touches a program's own configuration:

- a program that configured logging (`logging.basicConfig`, a handler on the root or on
  `shoal`) before the session or server starts gets nothing added;
- a program that configures logging later takes over from then on: the handler stands aside
  as soon as the root logger has a handler (and gives the `shoal` logger its unset level
  back), so lines are not printed twice;
- a level the program set on the `shoal` logger is kept;
- `logging.getLogger("shoal").setLevel(logging.WARNING)` before starting silences the INFO lines;
- without a level set on the `shoal` logger, the environment's `SHOAL_LOG_LEVEL` (DEBUG, INFO,
  WARNING, ERROR) sets it, also in a program that configured its own handlers (`basicConfig`).

Thread-safe (module-level lock); installing twice is a no-op.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"

_lock = threading.Lock()


class ShoalStderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (as logging's own last-resort handler),
    until the program configures logging itself."""

    def __init__(self, set_level: bool) -> None:
        super().__init__()
        self.set_level = set_level  # whether show_shoal_logs set the `shoal` logger's level
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass  # always the current sys.stderr

    def handle(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:  # the program configured logging since: its handlers get it
            _stand_aside(self)
            return False
        return super().handle(record)


LEVEL_VARIABLE = "SHOAL_LOG_LEVEL"
"""The level show_shoal_logs gives the `shoal` logger (DEBUG, INFO, WARNING or ERROR) when the
program set none on it, whether or not the program configured logging."""

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def level_from_environment(environ: Mapping[str, str]) -> int | None:
    """The level SHOAL_LOG_LEVEL names (any case), None if it is unset; a value that names no
    level is said once on stderr and None is returned (a log setting never stops a job)."""
    text = environ.get(LEVEL_VARIABLE, "").strip().upper()
    if not text:
        return None
    if text not in _LEVELS:
        if not _warned:
            _warned.append(text)
            print(f"shoal: {LEVEL_VARIABLE}={environ[LEVEL_VARIABLE]!r} is not a log level; ignored"
                  f" (write one of {', '.join(_LEVELS)})", file=sys.stderr, flush=True)
        return None
    return getattr(logging, text)


_warned: list[str] = []


def show_shoal_logs() -> bool:
    """Show Shoal's INFO lines on stderr if the program set up no logging (see the module
    docstring). Returns whether it installed the handler now. Does not block; thread-safe."""
    shoal_log = logging.getLogger("shoal")
    with _lock:
        asked = level_from_environment(os.environ)
        if asked is not None and shoal_log.level == logging.NOTSET:
            shoal_log.setLevel(asked)  # the user's word, whoever configured the handlers
        if logging.getLogger().handlers or shoal_log.handlers:
            return False
        set_level = shoal_log.level == logging.NOTSET
        if set_level:
            shoal_log.setLevel(logging.INFO)
        shoal_log.addHandler(ShoalStderrHandler(set_level))
        return True


def _stand_aside(handler: ShoalStderrHandler) -> None:
    shoal_log = logging.getLogger("shoal")
    with _lock:
        if handler not in shoal_log.handlers:
            return
        # a new list, not remove(): the logger may be iterating over the old one right now
        shoal_log.handlers = [h for h in shoal_log.handlers if h is not handler]
        if handler.set_level and shoal_log.level == logging.INFO:
            shoal_log.setLevel(logging.NOTSET)
