"""After Ctrl-C while `shoal train` follows its job in a terminal: detach (the job keeps running
in the background) or stop it? `ask_detach_or_stop` asks, reads one key, and stops when nobody
answers within a few seconds — so a Ctrl-C still stops the job, only later.

Reads the terminal directly (one key, without Enter, while it asks); blocks up to `timeout_s`.
"""

from __future__ import annotations

import os
import select
import termios
import time
import tty
from enum import Enum
from typing import IO, Optional

DEFAULT_TIMEOUT_S = 5.0


class Choice(Enum):
    """What to do with the job after Ctrl-C."""

    DETACH = "detach"   # stop following; the job keeps running
    STOP = "stop"       # stop the job (TERM, grace, KILL of every task)


def ask_detach_or_stop(stdin: Optional[IO[str]], err: IO[str], *,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> Choice:
    """Ask on `err`, read keys from `stdin`: `d` detaches; `s`, Enter, another Ctrl-C, end of
    input or `timeout_s` seconds of silence stop. Other keys are ignored."""
    err.write(f"\nshoal | Ctrl-C: [d]etach (the job keeps running) or [s]top it?"
              f" (stops in {timeout_s:g} s) ")
    err.flush()
    choice = _read_choice(stdin, timeout_s)
    err.write(f"{choice.value}\n")
    err.flush()
    return choice


def _read_choice(stdin: Optional[IO[str]], timeout_s: float) -> Choice:
    if stdin is None:
        return Choice.STOP
    try:
        fd = stdin.fileno()
    except (OSError, ValueError):
        return Choice.STOP
    saved = _cbreak(fd)
    try:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            data = os.read(fd, 64)
            if not data:
                break
            for key in data.decode(errors="replace").lower():
                if key == "d":
                    return Choice.DETACH
                if key in ("s", "\r", "\n", "\x03"):
                    return Choice.STOP
        return Choice.STOP
    except KeyboardInterrupt:
        return Choice.STOP
    except OSError:
        return Choice.STOP
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _cbreak(fd: int) -> Optional[list]:
    """Put the terminal in cbreak mode (keys without Enter, no echo); returns its settings to
    restore, None if `fd` is not a terminal."""
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        return None
    tty.setcbreak(fd, termios.TCSANOW)
    return saved
