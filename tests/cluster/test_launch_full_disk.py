"""A job whose log disk fills up: its task logs stop growing with one note each, while the
console still shows every line and the watchdog still sees progress (the job is not failed as
stuck), and a task restarted on the full disk starts (its log's first line is only noted).

The jobs folder is a small tmpfs (tests/small_disk.py: root only), unmounted at the end."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, program, run_shoal  # noqa: E402

from tests.small_disk import small_disk  # noqa: F401,E402  (a fixture)

pytestmark = pytest.mark.timeout(120)


def note(label: str, log: Path) -> str:
    return (f"shoal | {label}: cannot write its log {log}: No space left on device; its lines still"
            f" show here, and are no longer kept in the file (free space on that disk for later logs)")


@pytest.fixture
def full_home(tmp_path, small_disk):
    """(SHOAL_HOME whose jobs folder is the small disk, a function that fills it up to `leave` bytes left)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "jobs").symlink_to(small_disk.path)
    try:
        yield home, small_disk.fill
    finally:
        cleanup(home)


def test_console_and_watchdog_go_on_when_the_log_disk_fills(full_home):
    home, fill = full_home
    fill(8 << 10)  # about 3 s of the worker's lines; it prints for 8 s
    out = run_shoal(home, "run", "--name", "full", "--workers", "1", "--watchdog-stall", "2s",
                    "--watchdog-action", "fail", "--", PY, program("work.py"), "--steps", "400",
                    "--sleep", "8", timeout=90)
    text = out.stdout.decode()
    assert out.returncode == 0, text
    lines = text.splitlines()
    assert sum(line.startswith("full.worker.0 | step=") for line in lines) == 400
    assert "full.worker.0 | worker:0 done, exit 0" in lines
    [log] = (home / "jobs").resolve().glob("*/logs/worker.0.log")
    assert [line for line in lines if "cannot write" in line] == [note("full.worker.0", log)]
    assert 0 < log.stat().st_size <= 8 << 10


def test_task_restarted_on_a_full_log_disk_starts_and_succeeds(full_home):
    home, fill = full_home
    fill(0)
    out = run_shoal(home, "run", "--name", "full", "--workers", "1", "--restart", "on-failure",
                    "--backoff", "0.1s", "--output-dir", str(home / "model"), "--",
                    PY, program("flaky.py"), "--fail-times", "1", timeout=90)
    text = out.stdout.decode()
    assert out.returncode == 0, text
    lines = text.splitlines()
    assert sum(line.startswith("full.worker.0 | attempt ") for line in lines) == 2
    [log] = (home / "jobs").resolve().glob("*/logs/worker.0.log")
    assert [line for line in lines if "cannot write" in line] == [note("full.worker.0", log)] * 2
    assert log.stat().st_size == 0
