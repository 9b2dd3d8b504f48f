"""One job per model dir: an exclusive `flock` on `<model_dir>/.shoal.lock`.

Two jobs that share a model dir restore each other's checkpoints and prune each other's, so
the chief of a job holds this lock from its start to its close; a second job's chief is
refused at once with the dir and the holder (host, pid, since when) named.

The kernel drops the lock when the holding process dies, however it dies: there is never a
stale lock to clean up. The lock file stays (deleting a lock file races with the next
opener); it holds the holder's host, pid and start time as JSON while the lock is held and
is empty otherwise. On NFS, Linux emulates `flock` with byte-range locks held by the
server's lock manager, so the lock works across hosts there too; a mount without one
(`nolock`) refuses locks, and `acquire` says so.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from shoal.train.checkpoint import CheckpointError

LOCK_FILE = ".shoal.lock"


class ModelDirLockedError(CheckpointError):
    """Another process holds the model dir. `holder` is its {"host", "pid", "since"}, or None
    if it could not be read (it had only just taken the lock)."""

    def __init__(self, message: str, model_dir: Path, holder: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.model_dir = model_dir
        self.holder = holder


class LockState(enum.Enum):
    """FREE -> HELD (acquire) -> FREE (release); acquire when HELD and release when FREE do nothing."""

    FREE = "free"
    HELD = "held"


class ModelDirLock:
    """The exclusive lock of one model dir, for one job's chief.

    `acquire()` does not block: it takes the lock or raises. `release()` is idempotent; so is
    leaving a `with` block. Thread-safe. The lock is tied to this object's open file: a second
    ModelDirLock on the same dir in the same process is refused too (on local filesystems).
    A child process forked without exec shares the lock until it exits.
    """

    def __init__(self, model_dir: str | os.PathLike) -> None:
        self.model_dir = Path(model_dir).absolute()  # (the program may change its directory meanwhile)
        self.path = self.model_dir / LOCK_FILE
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._state = LockState.FREE

    @property
    def state(self) -> LockState:
        return self._state

    @property
    def held(self) -> bool:
        return self._state is LockState.HELD

    def acquire(self) -> ModelDirLock:
        """Take the lock, creating the model dir if needed. Does not block.

        Raises ModelDirLockedError if another process (or another ModelDirLock) holds it,
        CheckpointError if the model dir cannot be created or locked.
        """
        with self._mutex:
            if self._state is LockState.HELD:
                return self
            try:
                self.model_dir.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as e:
                raise CheckpointError(f"cannot create the lock file {self.path}: {e}; check that the model dir "
                                      f"{self.model_dir} is a writable directory (--model_dir)") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_holder(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise ModelDirLockedError(
                        f"model dir {self.model_dir} is in use by another job ({_describe(holder)}): two jobs in one "
                        "model dir restore and delete each other's checkpoints; stop that job, or give this one "
                        "another model dir (--model_dir / output_dir)", self.model_dir, holder) from e
                raise CheckpointError(f"cannot lock {self.path}: {e}; the filesystem of the model dir does not "
                                      "support file locks (NFS mounted with nolock?); use a model dir on a "
                                      "filesystem that does") from e
            try:
                _write_holder(fd)
            except OSError:
                pass  # the lock is what matters; the holder's name is only for the next job's message
            self._fd, self._state = fd, LockState.HELD
            return self

    def lost(self) -> str:
        """Why the lock, held, no longer guards the model dir ("" while it does): its lock file
        was removed or replaced (the model dir removed mid-run), or can no longer be read (an
        NFS handle gone stale), so another job could lock the dir now. Two stat calls: blocks
        only on a filesystem that hangs."""
        with self._mutex:
            if self._state is LockState.FREE:
                return ""
            try:
                held = os.fstat(self._fd)
                now = os.stat(self.path)
            except FileNotFoundError:
                return f"its lock file {self.path} is gone (the model dir was removed while the job ran)"
            except OSError as e:
                return f"its lock file {self.path} can no longer be read ({e.strerror or e}: the model dir was removed?)"
            if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                return f"its lock file {self.path} was replaced (the model dir was removed while the job ran)"
            return ""

    def release(self) -> None:
        """Let go of the lock; does nothing if it is not held. Does not block."""
        with self._mutex:
            if self._state is LockState.FREE:
                return
            fd, self._fd, self._state = self._fd, None, LockState.FREE
            try:
                os.ftruncate(fd, 0)  # while still locked: the next holder never reads this one's name
            except OSError:
                pass
            os.close(fd)  # releases the flock

    def __enter__(self) -> ModelDirLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ModelDirLock({str(self.model_dir)!r}, {self._state.value})"


def _write_holder(fd: int) -> None:
    data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    if isinstance(holder, dict) and isinstance(holder.get("pid"), int) and isinstance(holder.get("host"), str):
        return holder
    return None


def _describe(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "holder unknown"
    return f"pid {holder['pid']} on host {holder['host']}, since {holder.get('since', '?')}"
