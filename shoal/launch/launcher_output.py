"""Where a launcher's own console goes when no terminal shows it: `<job dir>/launcher.log`.

A detached launcher (`--detach`, shoal/launch/detach.py) writes its whole console there from
the start; a foreground launcher whose terminal hangs up (SIGHUP: the terminal closed, the ssh
session dropped) moves what it wrote to that terminal there (`move_terminal_output`) and keeps
the job running. `shoal attach` follows the file (shoal/launch/follow.py). The file is 0600 in
the job's 0700 folder, like the task logs.

Blocking (file system calls); `move_terminal_output` swaps file descriptors 0-2 of the whole
process, so call it from one thread (the main thread's signal handler).
"""

from __future__ import annotations

import errno
import os
import termios
from pathlib import Path

from shoal.launch.files import FILE_MODE, private_dirs, private_file

LAUNCHER_LOG = "launcher.log"
_FIX = "set SHOAL_HOME to a writable directory (default ~/.shoal)"


def launcher_log_path(job_dir: str | os.PathLike) -> Path:
    """The launcher's console file of the job whose folder is `job_dir`."""
    return Path(job_dir) / LAUNCHER_LOG


def open_launcher_log(path: Path) -> int:
    """The file opened for appending (created 0600, its folder 0700); returns the descriptor,
    which the caller closes. WorkspaceError if it cannot be."""
    private_dirs(path.parent, "the job's folder", _FIX)
    private_file(path, "the launcher's log", _FIX)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)


def move_terminal_output(path: Path) -> bool:
    """Point the process's stdout and stderr, where they are a terminal, at `path` (appending),
    and its stdin, where it is a terminal, at /dev/null; a stream that is a file or a pipe stays
    as it is. Returns whether anything moved. Writes that were already under way to the dead
    terminal fail with EIO, which the console's writers ignore."""
    terminals = [fd for fd in (1, 2) if _isatty(fd)]
    if terminals:
        log = open_launcher_log(path)
        try:
            for fd in terminals:
                os.dup2(log, fd)
        finally:
            os.close(log)
    if _isatty(0):
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        return True
    return bool(terminals)


def _isatty(fd: int) -> bool:
    """Whether `fd` is a terminal — also one that has hung up (isatty says no to those: asking
    a hung-up terminal anything fails with EIO)."""
    try:
        termios.tcgetattr(fd)
    except termios.error as e:
        return bool(e.args) and e.args[0] == errno.EIO
    return True
