"""`stop_like_ctrl_c`: while the launcher sets a job up — allocates and plans it: `sync: true`
copies the workdir, agents start on the hosts — SIGTERM (`shoal kill`, `timeout`, a closing
tmux) stops it as Ctrl-C does, instead of ending it on the spot: raised on the main thread as
`StoppedSettingUp`, a KeyboardInterrupt, so every `finally` on the way out runs (the executor's
close ends what it started), the executor can say what it was doing, and `shoal` exits 130.
Once the job runs, the runner's own handlers (stop_signals.py) take over.

`sigterm_ignored` keeps a second SIGTERM from cutting short the teardown that follows.
`stops_deferred` covers the moment between the setup and the runner's handlers (the job's
record being made): a SIGTERM or a Ctrl-C (SIGINT) then is remembered, and the runner stops the
job as soon as its handlers are in place, instead of the launcher dying on the spot with the
setup's executor (ssh agents, a Slurm allocation) not closed and the job's record left PENDING.

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
    """While inside (on the main thread): SIGTERM raises StoppedSettingUp where the thread is,
    and Ctrl-C (SIGINT) KeyboardInterrupt, as Python's own handler does (the one outside may
    defer it: `stops_deferred`). The handlers before are put back on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_stopped),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    try:
        yield
    finally:
        _put_back(previous)


def _put_back(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def sigterm_ignored() -> Iterator[None]:
    """While inside (on the main thread): SIGTERM is ignored, so that the teardown of a setup
    already stopped is not cut short by a second one (systemd, `timeout`). Ctrl-C is left to the
    handler outside (inside `stops_deferred`, as a launch is: remembered, not raised)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class DeferredStop:
    """The first stop signal (SIGTERM or SIGINT) that came while `stops_deferred` was in place,
    or None."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict = {}  # the handlers `stops_deferred` put back on leaving

    def _remember(self, signum: int, _frame: object) -> None:
        if self.signal is None:
            self.signal = signum

    def stop_deferring_ctrl_c(self) -> None:
        """From now on Ctrl-C (SIGINT) acts as before `stops_deferred` (Python's handler raises
        KeyboardInterrupt): once the job ended, a Ctrl-C cuts its teardown (the last rsync, the
        wait for scancel) short, as it always did. SIGTERM stays deferred. Does not block."""
        previous = self._previous.pop(signal.SIGINT, None)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextmanager
def stops_deferred() -> Iterator[DeferredStop]:
    """While inside (on the main thread): SIGTERM and SIGINT only set the yielded object's
    `signal`; handlers installed inside (the setup's, the runner's) take over while they are in
    place. The handlers before are put back on leaving."""
    deferred = DeferredStop()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return
    deferred._previous = {sig: signal.signal(sig, deferred._remember) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield deferred
    finally:
        _put_back(deferred._previous)
