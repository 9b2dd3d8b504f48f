"""A real disk that fills up: a 1 MiB tmpfs mounted for one test (root only), as a pytest fixture.

`small_disk` yields a SmallDisk; `fill()` writes a filler file until the tmpfs has no space
left (every later write there fails with ENOSPC), `free()` removes it. The tmpfs is unmounted
after the test, even when something still has a file open on it (a lazy unmount).
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest


class SmallDisk:
    """A mounted 1 MiB tmpfs at `path`. Blocks on the filesystem; not thread-safe."""

    def __init__(self, path: Path):
        self.path = path
        self._filler = path / "filler"

    def fill(self, leave: int = 0) -> None:
        """Write zeros until the disk is full, then give `leave` bytes of it back (whole 4 KiB
        pages). Blocks (a megabyte at most)."""
        chunk = bytes(4096)
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
            if leave:
                os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs that fills up needs root (CI runs the tests as root)")
    path = tmp_path / "small-disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(path)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs refused: {mounted.stderr.strip()} (a container without CAP_SYS_ADMIN?)")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
