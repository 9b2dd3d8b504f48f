"""One job per model dir: a second process is refused with the dir and the holder named."""

import errno
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.train.checkpoint import CheckpointError
from shoal.train.model_dir_lock import ModelDirLock, ModelDirLockedError

ROOT = Path(__file__).resolve().parents[2]  # children import this checkout's shoal

HOLDER = r"""
import sys
from shoal.train.model_dir_lock import ModelDirLock
with ModelDirLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()  # the test says let go (or kills this process)
print("released", flush=True)
"""


def _line(proc, timeout_s=60.0):
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"holder pid {proc.pid} said nothing within {timeout_s}s"
    return proc.stdout.readline().strip()


@pytest.fixture
def holder(tmp_path):
    """Starts a process that holds the lock of a model dir until told to let go."""
    started = []

    def start(model_dir):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        started.append(proc)
        assert _line(proc) == "held"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def test_second_process_is_refused_naming_the_dir_and_the_holder(tmp_path, holder):
    other = holder(tmp_path / "model")
    with pytest.raises(ModelDirLockedError) as refused:
        ModelDirLock(tmp_path / "model").acquire()
    message = str(refused.value)
    assert str(tmp_path / "model") in message
    assert f"pid {other.pid}" in message and socket.gethostname() in message
    assert refused.value.holder["pid"] == other.pid
    assert isinstance(refused.value, CheckpointError)


def test_lock_is_free_again_once_the_holder_releases_it(tmp_path, holder):
    other = holder(tmp_path)
    other.stdin.write("\n")
    other.stdin.flush()
    assert _line(other) == "released"
    with ModelDirLock(tmp_path) as lock:
        assert lock.held


def test_lock_is_free_again_once_the_holder_is_killed(tmp_path, holder):
    other = holder(tmp_path)
    os.kill(other.pid, signal.SIGKILL)
    other.wait(timeout=60)
    with ModelDirLock(tmp_path) as lock:
        assert lock.held


def test_other_process_is_refused_while_this_one_holds_it(tmp_path):
    with ModelDirLock(tmp_path):
        code = ("import sys; from shoal.train.model_dir_lock import ModelDirLock, ModelDirLockedError\n"
                "try: ModelDirLock(sys.argv[1]).acquire()\n"
                "except ModelDirLockedError as e: print(e.holder['pid'])")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                             cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(os.getpid())


def test_second_lock_in_the_same_process_is_refused(tmp_path):
    with ModelDirLock(tmp_path):
        with pytest.raises(ModelDirLockedError):
            ModelDirLock(tmp_path).acquire()


def test_acquire_and_release_are_idempotent(tmp_path):
    lock = ModelDirLock(tmp_path)
    lock.acquire()
    lock.acquire()
    assert lock.held
    lock.release()
    lock.release()
    assert not lock.held
    with ModelDirLock(tmp_path) as again:
        assert again.held


def test_leaving_the_with_block_on_an_error_releases_the_lock(tmp_path):
    with pytest.raises(RuntimeError):
        with ModelDirLock(tmp_path):
            raise RuntimeError("training failed")
    with ModelDirLock(tmp_path) as lock:
        assert lock.held


def test_constructor_touches_nothing_and_acquire_creates_the_model_dir(tmp_path):
    lock = ModelDirLock(tmp_path / "new" / "model")
    assert not (tmp_path / "new").exists()
    with lock:
        assert (tmp_path / "new" / "model").is_dir()


def test_model_dir_under_a_regular_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointError, match="file/model"):
        ModelDirLock(tmp_path / "file" / "model").acquire()


def test_a_lock_whose_file_was_removed_replaced_or_cannot_be_read_says_it_is_lost(tmp_path, monkeypatch):
    lock = ModelDirLock(tmp_path / "model").acquire()
    assert lock.lost() == ""
    os.rename(tmp_path / "model", tmp_path / "moved")
    assert "is gone" in lock.lost()
    os.rename(tmp_path / "moved", tmp_path / "model")  # moved back: the same file, held again
    assert lock.lost() == ""
    (tmp_path / "model" / ".shoal.lock").unlink()
    (tmp_path / "model" / ".shoal.lock").touch()
    assert "was replaced" in lock.lost()

    def stale(fd):
        raise OSError(errno.ESTALE, "Stale file handle")
    monkeypatch.setattr(os, "fstat", stale)  # NFS, after another host removed the dir
    assert "can no longer be read (Stale file handle" in lock.lost()
    monkeypatch.undo()
    lock.release()
    assert lock.lost() == ""


def test_a_lock_of_a_relative_model_dir_holds_after_the_program_changes_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lock = ModelDirLock("model").acquire()
    monkeypatch.chdir("/")
    assert lock.lost() == ""
    lock.release()
