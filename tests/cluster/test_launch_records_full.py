"""A job whose SHOAL_HOME fills up while it runs: the launcher says once that the records
cannot be written and the job runs to its end (it used to die on the first failed write, and
its watchdog then stopped the healthy tasks). A real tmpfs, so root only."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, start_shoal, status, wait_for  # noqa: E402

from tests.small_disk import small_disk  # noqa: F401,E402  (a fixture)

pytestmark = pytest.mark.timeout(120)

UNTIL_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\nprint('done')\n"


def test_a_job_whose_records_disk_fills_up_runs_to_its_end_and_says_so_once(tmp_path, small_disk):
    home, go = small_disk.path / "home", tmp_path / "go"
    launcher = start_shoal(home, "run", "--name", "full", "--workers", "2", "--output-dir", str(tmp_path / "model"),
                           "--", PY, "-c", UNTIL_FILE, str(go))
    try:
        wait_for(lambda: (jobs := status(home)) and all(t["state"] == "RUNNING" for t in jobs[0]["tasks"]),
                 timeout=30, what="both workers running")
        small_disk.fill()
        go.write_text("")  # the workers end (exit 0) now: their ends cannot be recorded
        out, _ = launcher.communicate(timeout=60)
        text = out.decode(errors="replace")
        assert launcher.returncode == 0, text
        notes = [line for line in text.splitlines() if line.startswith("shoal | cannot use the job records")]
        assert len(notes) == 1, text  # said once, not once per write
        assert "free space on the disk that holds" in notes[0] and "the job goes on" in notes[0], notes[0]
        assert "Traceback" not in text, text
        assert "full.worker.1: RUNNING -> SUCCEEDED (exit 0)" in text, text  # the console still says it
    finally:
        cleanup(home, launcher)
