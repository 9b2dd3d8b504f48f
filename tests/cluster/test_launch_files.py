"""The files a real job leaves are private to the user: job dir and logs dir 0700, log
files and the job records 0600, whatever the umask."""

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, cleanup, program, run_shoal, status  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_job_dir_logs_and_records_are_private(tmp_path):
    home = tmp_path / "home"
    old = os.umask(0o022)
    try:
        out = run_shoal(home, "run", "--name", "p", "--workers", "2", "--",
                        PY, program("work.py"), "--steps", "1", timeout=45)
        assert out.returncode == 0, out.stdout.decode()
        [job] = status(home)
        job_dir = Path(job["job_dir"])
        assert mode(home) == 0o700 and mode(home / "jobs") == 0o700
        assert mode(job_dir) == 0o700 and mode(job_dir / "logs") == 0o700
        assert mode(Path(job["model_dir"])) == 0o700  # the model dir the launcher made: checkpoints, summaries
        for log in ("worker.0.log", "worker.1.log"):
            assert mode(job_dir / "logs" / log) == 0o600, log
        assert mode(home / "jobs.db") == 0o600
    finally:
        os.umask(old)
        cleanup(home)
