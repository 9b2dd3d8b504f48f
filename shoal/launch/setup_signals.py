"""`stop_like_ctrl_c`: while the launcher sets a job up — allocates and plans it: `sync: true`
copies the workdir, agents start on the hosts — SIGTERM (`shoal kill`, `timeout`, a closing
tmux) stops it as Ctrl-C does, instead of ending it on the spot: raised on the main thread as
`StoppedSettingUp`, a KeyboardInterrupt, so every `finally` on the way out runs (the executor's
close ends what it started), the executor can say what it was doing, and `shoal` exits 130.
Once the job runs, the runner's own handlers (stop_signals.py) take over.

`sigterm_ignored` keeps a second SIGTERM from cutting short the teardown that follows.
`sigterm_deferred` covers the moment between the setup and the runner's handlers (the job's
record being made): a SIGTERM then is remembered, and the runner stops the job as soon as its
handlers are in place, instead of the launcher dying on the spot with the setup's executor
(ssh agents, a Slurm allocation) not closed.

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


class DeferredSigterm:
    """Whether a SIGTERM came while `sigterm_deferred` was in place."""

    def __init__(self) -> None:
        self.pending = False

    def _remember(self, _signum: int, _frame: object) -> None:
        self.pending = True


@contextmanager
def sigterm_deferred() -> Iterator[DeferredSigterm]:
    """While inside (on the main thread): SIGTERM only sets the yielded object's `pending`;
    handlers installed inside (the setup's, the runner's) take over while they are in place.
    The handler before is put back on leaving."""
    deferred = DeferredSigterm()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return
    previous = signal.signal(signal.SIGTERM, deferred._remember)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
