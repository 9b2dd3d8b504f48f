"""`stop_like_ctrl_c`: while the launcher sets a job up — allocates and plans it: `sync: true`
copies the workdir, agents start on the hosts — SIGTERM (`shoal kill`, `timeout`, a closing
tmux) stops it as Ctrl-C does, instead of ending it on the spot: raised on the main thread as
`StoppedSettingUp`, a KeyboardInterrupt, so every `finally` on the way out runs (the executor's
close ends what it started), the executor can say what it was doing, and `shoal` exits 130.
Once the job runs, the runner's own handlers (stop_signals.py) take over.

`sigterm_ignored` keeps a second SIGTERM from cutting short the teardown that follows.

Installs a handler only on the main thread (elsewhere signals cannot be handled); never blocks.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StoppedSettingUp(KeyboardInterrupt):
    """SIGTERM while the job was being set up: the launcher stops as after Ctrl-C."""


def stop_signal_name(error: KeyboardInterrupt) -> str:
    """The signal that raised `error`: SIGTERM for StoppedSettingUp, else SIGINT (Ctrl-C)."""
    return "SIGTERM" if isinstance(error, StoppedSettingUp) else "SIGINT"


def _raise_stopped(_signum: int, _frame: object) -> None:
    raise StoppedSettingUp()


@contextmanager
def stop_like_ctrl_c() -> Iterator[None]:
    """While inside (on the main thread): SIGTERM raises StoppedSettingUp where the thread is.
    The handler before is put back on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def sigterm_ignored() -> Iterator[None]:
    """While inside (on the main thread): SIGTERM is ignored, so that the teardown of a setup
    already stopped is not cut short by a second one (systemd, `timeout`). Ctrl-C still works."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
