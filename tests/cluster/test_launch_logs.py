"""The launcher's output: whole, prefixed lines on the console (none lost or split, even
with partial writes), per-task log files, `shoal logs` and `shoal logs -f`."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import PY, REPO, cleanup, program, run_shoal, start_shoal, status, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(90)
LINES = 5000
LINE_RE = re.compile(r"(worker:\d) line (\d+) (x*) end")


def check_lines(lines, task):
    """Every numbered line of `task` is present once, whole, in order."""
    numbers = []
    for line in lines:
        match = LINE_RE.fullmatch(line)
        assert match, f"split or mangled line: {line!r}"
        assert match.group(1) == task and len(match.group(3)) == int(match.group(2)) % 97
        numbers.append(int(match.group(2)))
    assert numbers == list(range(LINES))


def test_no_log_line_lost_or_split_with_two_fast_writers(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "spew", "--workers", "2", "--",
                        PY, program("spew.py"), "--lines", str(LINES), timeout=60)
        assert out.returncode == 0
        text = out.stdout.decode()
        for index in (0, 1):
            prefix = f"spew.worker.{index} | "
            lines = [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]
            check_lines(lines, f"worker:{index}")
        for line in text.splitlines():
            assert line.startswith(("spew.worker.0 | ", "spew.worker.1 | ", "shoal | ")), line
        [job] = status(home)
        for index in (0, 1):
            log = Path(job["job_dir"]) / "logs" / f"worker.{index}.log"
            check_lines(log.read_text().splitlines(), f"worker:{index}")
        logs = run_shoal(home, "logs", "spew", "--task", "worker.1", timeout=30)
        check_lines(logs.stdout.decode().splitlines(), "worker:1")
        both = run_shoal(home, "logs", job["id"], timeout=30).stdout.decode().splitlines()
        assert len(both) == 2 * LINES and both[0].startswith("spew.worker.0 | ")
    finally:
        cleanup(home)


def test_logs_follow_prints_lines_until_the_job_ends(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "f", "--workers", "1", "--",
                           PY, program("work.py"), "--steps", "5", "--sleep", "2")
    try:
        wait_for(lambda: status(home), 20, "the job to be recorded")
        follow = run_shoal(home, "logs", "f", "-f", timeout=30)
        lines = follow.stdout.decode().splitlines()
        assert lines[-1] == "f.worker.0 | worker:0 done, exit 0"
        assert sum("step=" in line for line in lines) == 5
        assert launcher.wait(20) == 0
    finally:
        cleanup(home, launcher)


def test_logs_follow_into_a_pipe_closed_early_exits_quietly_with_141(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "f", "--workers", "1", "--",
                           PY, program("work.py"), "--steps", "20", "--sleep", "8")  # a line every 0.4 s
    try:
        wait_for(lambda: status(home), 20, "the job to be recorded")
        reader = subprocess.Popen([PY, "-m", "shoal.cli.main", "logs", "f", "-f"], cwd=str(REPO),
                                  env=dict(os.environ, SHOAL_HOME=str(home)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        first = reader.stdout.readline()
        reader.stdout.close()  # as `| head -1` does after its line; the next line meets a closed pipe
        _, err = reader.communicate(timeout=30)
        assert first.startswith(b"f.worker.0 | ")
        assert reader.returncode == 141 and err == b"", err.decode()
        assert launcher.wait(30) == 0  # the job is not disturbed
    finally:
        cleanup(home, launcher)


def test_logs_follow_goes_on_from_the_start_of_a_log_truncated_meanwhile(tmp_path):
    home = tmp_path / "home"
    launcher = start_shoal(home, "run", "--name", "t", "--workers", "1", "--",
                           PY, program("work.py"), "--steps", "20", "--sleep", "8")  # a line every 0.4 s
    reader = None
    try:
        wait_for(lambda: status(home), 20, "the job to be recorded")
        log = Path(status(home)[0]["job_dir"]) / "logs" / "worker.0.log"
        reader = subprocess.Popen([PY, "-m", "shoal.cli.main", "logs", "t", "-f"], cwd=str(REPO),
                                  env=dict(os.environ, SHOAL_HOME=str(home)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
        line = b""
        while not line.startswith(b"t.worker.0 | step=120 "):  # bounded by the test's timeout
            line = reader.stdout.readline()
            assert line, "shoal logs -f ended before step 120"
        os.truncate(log, 0)  # as `: > worker.0.log` or logrotate's copytruncate do
        out, err = reader.communicate(timeout=40)
        lines = out.decode().splitlines()
        assert lines[-1:] == ["t.worker.0 | worker:0 done, exit 0"]  # the lines after it were printed
        assert err.decode() == f"({log} was truncated; following it from its start)\n"
        assert any(line.startswith("t.worker.0 | step=200 ") for line in lines)
        assert all(line.startswith("t.worker.0 | step=") for line in lines[:-1]), lines
        assert launcher.wait(20) == 0
    finally:
        if reader is not None and reader.poll() is None:
            os.killpg(reader.pid, 9)
            reader.wait(10)
        cleanup(home, launcher)
