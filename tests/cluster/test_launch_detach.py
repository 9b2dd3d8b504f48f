"""Unattended runs under the real launcher: `--detach` then `shoal attach`, Ctrl-C on attach,
Ctrl-C in a terminal (a real pseudo-terminal: detach or stop), and a launcher whose terminal
hangs up. Every wait is bounded; every process is killed by its recorded pid or group."""

import fcntl
import os
import re
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, REPO, alive, cleanup_launchers, launcher_pids, only_job, program,  # noqa: E402
                     run_shoal, shoal_env, start_shoal, wait_for)

pytestmark = pytest.mark.timeout(90)
JOB_ID = re.compile(r"^job (\S+) runs in the background", re.M)


class TerminalShoal:
    """`shoal ARGS` in its own session on a pseudo-terminal that is its controlling terminal:
    stdout and stderr always, stdin too unless `stdin_tty=False` (then /dev/null). A thread
    keeps reading what it writes (`text`)."""

    def __init__(self, home: Path, *args: str, stdin_tty: bool = True) -> None:
        master, slave = os.openpty()
        self._master = master
        self._chunks: list[bytes] = []
        stdin = slave if stdin_tty else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [PY, "-m", "shoal.cli.main", *args], cwd=str(REPO), env=shoal_env(home),
            stdin=stdin, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(1, termios.TIOCSCTTY, 0))
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError:  # EIO: the other side is gone; EBADF: we hung up
                return
            if not data:
                return
            self._chunks.append(data)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")

    def expect(self, pattern: str, timeout: float) -> re.Match:
        return wait_for(lambda: re.search(pattern, self.text, re.M), timeout, f"{pattern!r} in:\n{self.text}")

    def type(self, data: bytes) -> None:
        os.write(self._master, data)

    def hang_up(self) -> None:
        """Close the terminal, as a closed window or a dropped ssh session does."""
        os.close(self._master)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def test_detach_returns_at_once_and_attach_follows_the_job_to_its_exit_code(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "a", "--workers", "1", "--detach", "--",
                        PY, program("work.py"), "--steps", "4", "--sleep", "3", "--exit", "3", timeout=30)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        job_id = JOB_ID.search(text).group(1)
        assert f"shoal attach {job_id}" in text and f"shoal kill {job_id}" in text
        job = only_job(home)
        assert job["id"] == job_id and job["state"] in ("PENDING", "RUNNING")  # it runs without us
        if "runs in the background" in text:  # recorded: its number is known
            assert f"runs in the background (number {job['number']}, launcher pid" in text, text
        attach = run_shoal(home, "attach", "a", timeout=60)
        followed = attach.stdout.decode()
        assert attach.returncode == 3, followed  # the job's exit code: its chief's
        assert "a.worker.0 | step=10 loss=1.0000" in followed
        assert "a.worker.0 | worker:0 done, exit 3" in followed
        assert f"shoal | job {job_id}: FAILED" in followed
        assert only_job(home)["state"] == "FAILED"
        assert alive(launcher_pids(home)) == []
    finally:
        cleanup_launchers(home)


def test_ctrl_c_on_attach_only_detaches_and_the_job_keeps_running(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "b", "--workers", "1", "--detach", "--",
                        PY, program("serve.py"), timeout=30)
        assert out.returncode == 0, out.stdout.decode()
        attach = start_shoal(home, "attach", "b")
        try:
            wait_for(lambda: "b.worker.0 | serving worker:0" in Path(only_job(home)["job_dir"], "launcher.log")
                     .read_text(), 30, "the task to serve")
            time.sleep(0.5)  # the attach's first poll
            attach.send_signal(signal.SIGINT)
            followed, _ = attach.communicate(timeout=15)
        finally:
            if attach.poll() is None:
                attach.kill()
        assert attach.returncode == 0
        assert "detached; job b-" in followed.decode() and "keeps running" in followed.decode()
        job = only_job(home)
        assert job["state"] == "RUNNING" and alive(launcher_pids(home))
        killed = run_shoal(home, "kill", "b", timeout=40)
        assert killed.returncode == 0 and "KILLED" in killed.stdout.decode()
    finally:
        cleanup_launchers(home)


def test_launcher_whose_terminal_hangs_up_keeps_the_job_running_to_success(tmp_path):
    home = tmp_path / "home"
    shoal = TerminalShoal(home, "run", "--name", "h", "--workers", "2", "--",
                          PY, program("work.py"), "--steps", "6", "--sleep", "4", stdin_tty=False)
    try:
        shoal.expect(r"h\.worker\.1 \| step=10", 30)
        shoal.hang_up()  # SIGHUP to the launcher; its writes to the terminal now fail (EIO)
        assert shoal.proc.wait(30) == 0
        job = only_job(home)
        assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0
        assert {t["state"] for t in job["tasks"]} == {"SUCCEEDED"}
        log = (Path(job["job_dir"]) / "launcher.log").read_text()
        assert "the terminal hung up (SIGHUP)" in log
        assert "h.worker.0 | worker:0 done, exit 0" in log  # what it printed after the hang-up
        assert f"shoal | job {job['id']}: SUCCEEDED" in log
    finally:
        shoal.kill()
        cleanup_launchers(home)


def test_ctrl_c_in_a_terminal_offers_to_detach_and_detaching_leaves_the_job_running(tmp_path):
    home = tmp_path / "home"
    shoal = TerminalShoal(home, "run", "--name", "t", "--workers", "1", "--", PY, program("serve.py"))
    try:
        shoal.expect(r"t\.worker\.0 \| serving worker:0", 30)
        shoal.type(b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground process group
        shoal.expect(r"\[d\]etach .* or \[s\]top it\?", 10)
        shoal.type(b"d")
        assert shoal.proc.wait(15) == 0
        assert re.search(r"detached; job t-\S+ keeps running", shoal.text)
        job = only_job(home)
        assert job["state"] == "RUNNING" and alive(launcher_pids(home))
        killed = run_shoal(home, "kill", "t", timeout=40)
        assert killed.returncode == 0 and "KILLED" in killed.stdout.decode()
    finally:
        shoal.kill()
        cleanup_launchers(home)


def test_unanswered_ctrl_c_in_a_terminal_stops_the_job(tmp_path):
    home = tmp_path / "home"
    shoal = TerminalShoal(home, "run", "--name", "s", "--workers", "1", "--", PY, program("serve.py"))
    try:
        shoal.expect(r"s\.worker\.0 \| serving worker:0", 30)
        shoal.type(b"\x03")
        shoal.expect(r"or \[s\]top it\?", 10)  # nobody answers: it stops after 5 s
        assert shoal.proc.wait(30) == 130
        assert "stopping job s-" in shoal.text
        job = only_job(home)
        assert job["state"] == "KILLED" and job["exit_code"] == 130
        assert job["reason"] == "stopped by Ctrl-C", job["reason"]  # not "the launcher got SIGTERM"
        assert alive(launcher_pids(home)) == []
    finally:
        shoal.kill()
        cleanup_launchers(home)


def test_sigterm_to_shoal_run_in_a_terminal_stops_the_job_without_asking(tmp_path):
    home = tmp_path / "home"
    shoal = TerminalShoal(home, "run", "--name", "term", "--workers", "1", "--", PY, program("serve.py"))
    try:
        shoal.expect(r"term\.worker\.0 \| serving worker:0", 30)
        shoal.proc.send_signal(signal.SIGTERM)  # `timeout`, a closing tmux: the command, not the job
        assert shoal.proc.wait(30) == 130
        assert "[d]etach" not in shoal.text and "stopping job term-" in shoal.text, shoal.text
        job = only_job(home)
        assert job["state"] == "KILLED" and alive(launcher_pids(home)) == []
        assert job["reason"] == "stopped by SIGTERM to the shoal command following it", job["reason"]
    finally:
        shoal.kill()
        cleanup_launchers(home)


def test_detach_of_a_job_whose_command_cannot_run_says_it_ended_and_exits_with_its_code(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "run", "--name", "nope", "--workers", "1", "--detach", "--", "/nonexistent/cmd",
                        timeout=30)
        text = out.stdout.decode()
        assert out.returncode == 127, text
        assert "runs in the background" not in text and "ended already: FAILED" in text, text
        logs = run_shoal(home, "logs", "nope", timeout=30)
        assert "nope.worker.0: no log: FAILED" in logs.stdout.decode() and "cannot run" in logs.stdout.decode()
    finally:
        cleanup_launchers(home)


def test_a_typo_in_a_terminal_leaves_no_job_folder(tmp_path):
    home = tmp_path / "home"
    shoal = TerminalShoal(home, "run", "--name", "typo", "--workers", "1", "--", PY, "no_such_script.py")
    try:
        assert shoal.proc.wait(30) != 0
        assert "no_such_script.py, which does not exist" in shoal.text, shoal.text
        assert not any((home / "jobs").glob("typo-*")), list((home / "jobs").iterdir())
    finally:
        shoal.kill()
        cleanup_launchers(home)
