"""A SIGTERM or a Ctrl-C (SIGINT) that reaches the launcher after the job's setup and before
the runner's own handlers (while the job's record is being made) stops the job as that signal
does while it runs, instead of killing the launcher on the spot with its executor not closed (ssh
agents, a Slurm allocation) and the job's record left PENDING. The window is held open by
holding the records' write lock."""

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, alive, cleanup, program, recorded_pids, run_ok, start_shoal, status, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_job_is_being_recorded_stops_it_cleanly(tmp_path, signum):
    home = tmp_path / "home"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: t\nrun: {PY} {program('work.py')} --steps 100000\n"
                    f"roles:\n  ps: {{count: 1, run: {PY} {program('serve.py')}}}\n  worker: {{count: 1}}\n")
    run_ok(home, "status")  # the records exist
    records = sqlite3.connect(str(home / "jobs.db"), timeout=1, isolation_level=None)
    records.execute("BEGIN IMMEDIATE")  # the launcher's first write (recording the job) waits for this
    launcher = start_shoal(home, "train", str(spec))
    try:
        wait_for(lambda: any(home.glob("jobs/*/logs")), 30, "the runner to make the job's folders")
        time.sleep(0.5)  # it waits on the lock now, its signal handlers not yet in place
        os.kill(launcher.pid, signum)
        time.sleep(0.5)
        assert launcher.poll() is None, f"the launcher died of the {signum.name} on the spot"
        records.execute("ROLLBACK")
        records.close()
        out, _ = launcher.communicate(timeout=60)
        [job] = status(home)
        assert job["state"] == "KILLED" and job["reason"] == f"the launcher got {signum.name}", (job, out.decode())
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home, launcher)
