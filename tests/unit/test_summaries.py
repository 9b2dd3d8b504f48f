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


def _wait_until(condition, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_full_disk_pauses_summaries_with_one_warning_steps_go_on_and_they_resume_once_it_is_freed(
        small_disk, caplog, monkeypatch):
    monkeypatch.setattr("shoal.train.event_file.RETRY_SECS", 0.3)
    logdir = small_disk.path / "model"
    s = TaskSummaries(logdir, every_steps=1, is_chief=True).open()
    _steps(s, 1, 10)
    s.flush()
    assert _wait_until(lambda: 1 <= len(_scalars(logdir).get("loss", [])), 30)  # on disk before it fills
    small_disk.fill()
    with caplog.at_level(logging.INFO, logger="shoal.train.event_file"):
        assert _finishes(lambda: _steps(s, 11, 2000), 30), "a step blocked on the full disk"
        assert _wait_until(lambda: _stopped(caplog), 30), "the writer never found the disk full"
        assert _finishes(lambda: _steps(s, 2011, 2000), 30), "a step blocked while the summaries were paused"
        time.sleep(1.0)  # retries on the full disk: each new file fails its first flush and is removed
        assert _files_kept(logdir) == 1, sorted(p.name for p in logdir.iterdir())
        small_disk.free()
        assert _wait_until(lambda: any("go on in" in r.getMessage() for r in caplog.records), 30), caplog.text
        _steps(s, 5001, 20)
        assert _finishes(s.close, 30)
    assert _stopped(caplog) == [f"summaries to {logdir} stopped: No space left on device; training goes on, and a new "
                                "event file is tried every 0.3s (free the disk or fix the directory; values meanwhile "
                                "are dropped)"]
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    steps = [step for step, _ in _scalars(logdir)["loss"]]
    assert steps[:10] == list(range(1, 11)) and steps[-20:] == list(range(5001, 5021)), steps


def _files_kept(logdir):
    """The event files in `logdir` that hold more than a retry's file does while it is tried
    (created, then removed when its first flush fails)."""
    kept = 0
    for path in logdir.glob("events.out.tfevents.*"):
        try:
            kept += path.stat().st_size > 0
        except FileNotFoundError:
            pass
    return kept


def test_summaries_opened_on_a_full_disk_pause_and_go_on_once_it_is_freed(small_disk, caplog, monkeypatch):
    monkeypatch.setattr("shoal.train.event_file.RETRY_SECS", 0.2)
    small_disk.fill()
    logdir = small_disk.path / "model"
    with caplog.at_level(logging.INFO, logger="shoal.train.event_file"):
        s = TaskSummaries(logdir, every_steps=1, is_chief=True).open()
        assert _wait_until(lambda: _stopped(caplog), 30), "the first flush never found the disk full"
        small_disk.free()
        assert _wait_until(lambda: any("go on in" in r.getMessage() for r in caplog.records), 30), caplog.text
        _steps(s, 1, 5)
        s.close()
    assert [step for step, _ in _scalars(logdir)["loss"]] == [1, 2, 3, 4, 5]
    assert len(list(logdir.iterdir())) == 1  # the file opened on the full disk, empty, was removed


def test_a_disk_that_fills_again_and_again_warns_once(small_disk, caplog, monkeypatch):
    monkeypatch.setattr("shoal.train.event_file.RETRY_SECS", 0.2)
    logdir = small_disk.path / "model"
    s = TaskSummaries(logdir, every_steps=1, is_chief=True).open()
    with caplog.at_level(logging.INFO, logger="shoal.train.event_file"):
        for round_ in range(3):
            small_disk.fill()
            _steps(s, 1 + round_ * 2000, 2000)
            s.flush()
            assert _wait_until(lambda: sum("paused again" in r.getMessage() or "stopped" in r.getMessage()
                                           for r in caplog.records) > round_, 30), caplog.text
            small_disk.free()
            assert _wait_until(lambda: sum("go on in" in r.getMessage() for r in caplog.records) > round_, 30)
        s.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "fall behind" not in
                r.getMessage()]
    assert len(warnings) == 1 and "stopped: No space left on device" in warnings[0], warnings
    assert sum("paused again (No space left on device)" in r.getMessage() for r in caplog.records) == 2


def test_closing_summaries_still_paused_returns_at_once_and_says_what_was_lost(small_disk, caplog, monkeypatch):
    monkeypatch.setattr("shoal.train.event_file.RETRY_SECS", 60.0)
    s = TaskSummaries(small_disk.path / "model", every_steps=1, is_chief=True).open()
    small_disk.fill()
    with caplog.at_level(logging.WARNING, logger="shoal.train.event_file"):
        _steps(s, 1, 2000)
        assert _wait_until(lambda: _stopped(caplog), 30)
        _steps(s, 2001, 100)
        started = time.monotonic()
        s.close()
        assert time.monotonic() - started < 5  # not the minute until its next try
    assert any(r.getMessage().startswith(f"summaries to {small_disk.path / 'model'} were still paused at the end: ")
               for r in caplog.records), caplog.text


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


def test_a_last_flush_that_fails_at_close_says_the_last_values_were_lost(small_disk, caplog):
    logdir = small_disk.path / "model"
    s = TaskSummaries(logdir, every_steps=1, is_chief=True).open()
    s.flush()
    assert _wait_until(lambda: _files_kept(logdir) == 1, 30)  # the version record is on disk
    small_disk.fill()
    for step in (1, 2):  # ~5 KB: more than the file's last page has left, less than its 8 KiB buffer
        s.scalar("a_long_tag_" * 230, 0.5, step)
    with caplog.at_level(logging.WARNING, logger="shoal.train.event_file"):
        assert _finishes(s.close, 30)
    assert [r.getMessage() for r in caplog.records] == [
        f"summaries to {logdir}: the last values did not reach the disk: No space left on device"]
