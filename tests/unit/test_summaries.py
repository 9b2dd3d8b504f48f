"""TensorBoard event files written with tensorboardX, read back with TensorBoard's own reader."""

import io
import logging
import subprocess
import sys
import threading
import time

import pytest

from shoal.train.summaries import TaskSummaries
from tests.small_disk import small_disk  # noqa: F401  (a fixture)

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _scalars(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_chief_writes_step_rate_learning_rate_and_its_own_scalars(tmp_path):
    s = TaskSummaries(tmp_path, every_steps=2, is_chief=True).open()
    for step in range(1, 6):
        s.step_done(step, learning_rate=0.5)
    s.scalar("loss", 0.25, 5)
    s.close()
    scalars = _scalars(tmp_path)
    assert {"step_time_ms", "global_step/sec", "learning_rate", "loss"} <= scalars.keys()
    assert [step for step, _ in scalars["step_time_ms"]] == [3, 5]
    assert scalars["learning_rate"][0][1] == pytest.approx(0.5)
    assert scalars["loss"] == [(5, pytest.approx(0.25))]
    assert all(value > 0 for _, value in scalars["global_step/sec"])


def test_other_workers_write_only_their_step_times(tmp_path):
    s = TaskSummaries(tmp_path, every_steps=1, is_chief=False).open()
    for step in range(1, 4):
        s.step_done(step, learning_rate=0.5)
    s.close()
    assert set(_scalars(tmp_path)) == {"step_time_ms"}


def test_opening_summaries_does_not_import_torch(tmp_path):
    pytest.importorskip("torch")  # only meaningful where torch is installed (tensorboardX would import it)
    code = ("import sys; from shoal.train.summaries import TaskSummaries; "
            f"TaskSummaries({str(tmp_path)!r}, is_chief=True).open().close(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_opening_prints_the_absolute_directory_for_the_launcher(tmp_path, monkeypatch):
    import re

    from shoal.launch.logmux import SUMMARIES_RE

    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    s = TaskSummaries("runs/worker_1", is_chief=False, out=out).open()
    s.close()
    [line] = out.getvalue().splitlines()
    match = SUMMARIES_RE.fullmatch(line.encode())
    assert match and match.group(1).decode() == str(tmp_path / "runs" / "worker_1")
    assert re.search("events", " ".join(p.name for p in (tmp_path / "runs" / "worker_1").iterdir()))


def _finishes(fn, timeout_s):
    """Whether fn() returns within timeout_s (it runs on a daemon thread, so a hang stays there)."""
    done = threading.Event()
    threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
    return done.wait(timeout_s)


def _steps(summaries, first, count):
    for step in range(first, first + count):
        summaries.step_done(step, learning_rate=0.1)
        summaries.scalar("loss", 0.5, step)


def _stopped(caplog):
    return [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]


def test_full_disk_stops_summaries_with_one_warning_and_steps_go_on(small_disk, caplog):
    logdir = small_disk.path / "model"
    s = TaskSummaries(logdir, every_steps=1, is_chief=True).open()
    small_disk.fill()
    with caplog.at_level(logging.WARNING, logger="shoal.train.event_file"):
        assert _finishes(lambda: _steps(s, 1, 2000), 30), "a step blocked on the full disk"
        deadline = time.monotonic() + 30  # the writer thread fails at its first write to disk
        while not _stopped(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _finishes(lambda: _steps(s, 2001, 2000), 30), "a step blocked after the summaries failed"
        small_disk.free()
        assert _finishes(lambda: _steps(s, 4001, 2000), 30)
        assert _finishes(s.close, 30)
    assert _stopped(caplog) == [f"summaries to {logdir} stopped: No space left on device; training goes on without "
                                "them until this task starts again (free the disk or fix the directory for the next "
                                "start)"]


def test_summaries_dir_that_cannot_be_made_is_one_warning_not_an_error(tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="shoal.train.event_file"):
        s = TaskSummaries(tmp_path / "file" / "model", every_steps=1, is_chief=True, out=out).open()
        _steps(s, 1, 10)
        s.close()
    [warning] = _stopped(caplog)
    assert str(tmp_path / "file" / "model") in warning and "Not a directory" in warning
    assert out.getvalue() == ""  # no summaries= line: there are none to serve
