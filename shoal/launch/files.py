"""Shoal's own files on this machine are private to the user: directories it creates are
0700, files 0600 (job records, their WAL/SHM files, task logs), whatever the umask — they
hold job ids, command lines and logs that may carry credentials.

Blocking (file system calls); thread-safe. Errors are WorkspaceErrors naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shoal.launch.errors import WorkspaceError

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dirs(path: Path, what: str, fix: str) -> None:
    """Create `path` and its missing parents, each new one mode 0700. The error names the
    directory as `what` ("the model dir") and ends with `fix` (how to mend it)."""
    missing = []
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            break
        missing.append(part)
    try:
        for part in reversed(missing):
            try:
                os.mkdir(part, DIR_MODE)
            except FileExistsError:
                continue  # made meanwhile by another process
            os.chmod(part, DIR_MODE)  # mkdir's mode is cut by the umask
        if not path.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(path))
    except OSError as e:
        raise WorkspaceError(_message(what, path, e, fix)) from e


def private_file(path: Path, what: str, fix: str) -> None:
    """Create `path` (empty, 0600) if it does not exist; make an existing one of ours that
    others can read 0600."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        tighten_file(path, what, fix)
    except OSError as e:
        raise WorkspaceError(_message(what, path, e, fix)) from e


def tighten_file(path: Path, what: str, fix: str) -> None:
    """Make `path`, if it exists and is ours, 0600 when others can read or change it;
    never creates it."""
    try:
        info = os.stat(path)
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
            os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise WorkspaceError(_message(what, path, e, fix)) from e


def _message(what: str, path: Path, error: OSError, fix: str) -> str:
    where = f" ({error.filename})" if error.filename and str(error.filename) != str(path) else ""
    return f"cannot use {what} {path}: {error.strerror or error}{where}; {fix}"

