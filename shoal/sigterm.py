"""SIGTERM as a request to finish, for the runtime's long-lived parts.

`acquire()` installs, on the main thread and only where SIGTERM still has its default action,
a handler that records the signal instead of ending the process; `requested()` says whether one
came. TrainingSession checks it at every step boundary (shoal/train/shutdown.py: the chief saves
a checkpoint, the session ends with `TrainingTerminated`) and `shoal.Server` while it serves (it
keeps serving until the training replicas have finished, so the chief can still snapshot it;
shoal/ps/draining.py). So a job stopped by `shoal kill`, its deadline or a scheduler's
preemption — all SIGTERM, then SIGKILL after a grace period — ends with a final checkpoint
instead of mid-step.

A second SIGTERM ends the process at once, as SIGTERM's default action would. A program that
set its own SIGTERM handler keeps it: nothing is installed, and `requested()` turns True only if
that handler calls `request()`. Reference counted: every `acquire` is paired with a `release`;
the last release puts the default action back (if Shoal's handler is still the one installed).

The signal is process-wide, so this state is too (one per process, as the handler is). All
functions are thread-safe and never block; the handler itself runs on the main thread (Python's
rule) and only sets a flag.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Optional

EXIT_STATUS = 128 + int(signal.SIGTERM)
"""143: how a program that stopped because of SIGTERM exits (as a shell reports SIGTERM)."""

_lock = threading.Lock()
_users = 0
_installed = False
_requested_at: Optional[float] = None


def acquire() -> bool:
    """Count one more user of SIGTERM-as-a-request; the first installs the handler when called
    on the main thread while SIGTERM has its default action. Returns whether Shoal's handler is
    in place (False: another thread, or the program handles SIGTERM itself)."""
    global _users, _installed
    with _lock:
        _users += 1
        if not _installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                _installed = True
        return _installed


def release() -> None:
    """Undo one `acquire`; the last one puts SIGTERM's default action back (on the main thread;
    from another thread the handler stays, harmlessly, until the process ends)."""
    global _users, _installed
    with _lock:
        _users = max(0, _users - 1)
        if _users or not _installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _installed = False


def requested() -> bool:
    """Whether a SIGTERM (or `request()`) asked this process to finish."""
    return _requested_at is not None


def requested_at() -> Optional[float]:
    """When (time.monotonic) the first request came; None if none did."""
    return _requested_at


def request() -> None:
    """Ask this process to finish as a SIGTERM would: for a program's own SIGTERM handler,
    or another thread. Idempotent."""
    global _requested_at
    if _requested_at is None:
        _requested_at = time.monotonic()


def clear() -> None:
    """Forget a request: for a process that carries on after it stopped what SIGTERM asked to
    stop (a test suite, an interactive session)."""
    global _requested_at
    _requested_at = None


def _on_sigterm(signum: int, _frame: object) -> None:
    if _requested_at is not None:  # a second SIGTERM: end now, as the default action does
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    request()
