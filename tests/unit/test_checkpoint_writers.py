"""Saving beside other writers, and saving when the disk fails: CheckpointError, nothing half-done.

The other writers are real processes (`python -c`), paused inside `save_checkpoint` just before
they write their manifest, so that the test decides what happens meanwhile.
"""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.train.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint
from tests.unit.test_checkpoint_files import _save

ROOT = Path(__file__).resolve().parents[2]  # children import this checkout's shoal

WRITER = r"""
import resource, signal, sys
import numpy as np
import shoal.train.checkpoint as checkpoint

model_dir, step, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
real = checkpoint._write_durably

def paused(path, data):
    print("paused", flush=True)
    sys.stdin.readline()  # the test says go on (or kills this process)
    real(path, data)

if how == "pause":
    checkpoint._write_durably = paused
elif how == "small-disk":  # every file this process writes is cut at 4 KiB, as on a full disk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    path = checkpoint.save_checkpoint(model_dir, step, {"w": np.ones(65536, np.float32)}, {},
                                      optimizer={"name": "sgd", "learning_rate": 0.1}, mode="async")
    print("saved", path, flush=True)
except Exception as e:
    print("error", type(e).__module__, type(e).__name__, e, flush=True)
"""


def _start_writer(model_dir, step, how):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(model_dir), str(step), how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def _line(proc, timeout_s=60.0):
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"writer pid {proc.pid} said nothing within {timeout_s}s"
    return proc.stdout.readline().strip()


def _go_on(proc):
    proc.stdin.write("\n")
    proc.stdin.flush()
    line = _line(proc)
    proc.wait(timeout=60)
    return line


@pytest.fixture
def writers():
    started = []
    yield lambda *args: started.append(_start_writer(*args)) or started[-1]
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def _temp_dirs(model_dir):
    return [p for p in (model_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_save_leaves_a_live_writers_temp_dir_alone(tmp_path, writers):
    other = writers(tmp_path, 7, "pause")
    assert _line(other) == "paused"
    _save(tmp_path, 10)
    assert len(_temp_dirs(tmp_path)) == 1, "the paused writer's temp dir must survive another save"
    assert _go_on(other).startswith("saved")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-0000000007", "ckpt-0000000010"]


def test_save_removes_the_temp_dir_of_a_writer_that_died(tmp_path, writers):
    other = writers(tmp_path, 7, "pause")
    assert _line(other) == "paused"
    os.kill(other.pid, signal.SIGKILL)
    other.wait(timeout=60)
    assert len(_temp_dirs(tmp_path)) == 1
    _save(tmp_path, 10)
    assert _temp_dirs(tmp_path) == []


def test_two_saves_of_the_same_step_at_once_use_different_temp_dirs(tmp_path, writers):
    first, second = writers(tmp_path, 7, "pause"), writers(tmp_path, 7, "pause")
    assert _line(first) == "paused" and _line(second) == "paused"
    assert len(_temp_dirs(tmp_path)) == 2
    assert _go_on(first).startswith("saved") and _go_on(second).startswith("saved")
    assert load_latest_checkpoint(tmp_path).step == 7


def test_full_disk_during_save_raises_checkpoint_error_naming_the_path(tmp_path, writers):
    line = _line(writers(tmp_path, 7, "small-disk"))
    assert line.startswith("error shoal.train.checkpoint"), line
    assert str(tmp_path / "checkpoints") in line and "space" in line
    assert list_checkpoints(tmp_path) == [] and _temp_dirs(tmp_path) == []


def test_model_dir_removed_mid_save_raises_checkpoint_error_naming_the_path(tmp_path, writers):
    model_dir = tmp_path / "model"
    other = writers(model_dir, 7, "pause")
    assert _line(other) == "paused"
    (model_dir / "checkpoints").rename(tmp_path / "moved")  # as `rm -r`, but the test can look inside
    line = _go_on(other)
    assert line.startswith("error shoal.train.checkpoint"), line
    assert str(model_dir / "checkpoints") in line


def test_model_dir_under_a_regular_file_raises_checkpoint_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointError, match="file/model"):
        _save(tmp_path / "file" / "model", 10)


def test_checkpoints_dir_replaced_by_a_file_raises_checkpoint_error(tmp_path):
    _save(tmp_path, 10)
    (tmp_path / "checkpoints").rename(tmp_path / "old")
    (tmp_path / "checkpoints").write_text("a file where the checkpoints were")
    with pytest.raises(CheckpointError, match="checkpoints"):
        _save(tmp_path, 20)


def test_checkpoint_moved_out_by_a_save_that_died_is_put_back(tmp_path):
    """A save of a step already saved moves the old one out first; dying right then loses nothing."""
    _save(tmp_path, 10)
    (tmp_path / "checkpoints" / "ckpt-0000000010").rename(tmp_path / "checkpoints" / ".old-ckpt-0000000010-h-1-x")
    _save(tmp_path, 20)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-0000000010", "ckpt-0000000020"]
