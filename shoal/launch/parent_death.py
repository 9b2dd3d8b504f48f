"""`die_with_parent`: the preexec function that asks the kernel to SIGKILL a child when the
thread that started it ends (Linux's PR_SET_PDEATHSIG; elsewhere it does nothing).

prctl is looked up once, at import: a preexec function must not dlopen in the forked child,
where a lock another thread held at fork time would never be released. The signal fires when
the *thread* that forked the child exits, so children must be started from a thread that lives
as long as they should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

_PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn for a child of `parent_pid` (pass os.getpid()): SIGKILL when the parent
    goes; if it is already gone when the child starts, the child exits at once."""

    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup
