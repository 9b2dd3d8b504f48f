"""Process mechanics of local jobs: `LocalProcess` runs one task in its own process group,
`Reaper` makes sure the groups die with the launcher.

No policy here (that is `supervisor`): this module starts, signals, waits for and reaps
processes. Linux is the target; on other POSIX systems the parent-death signal is skipped
and the reaper alone cleans up.

Why both a parent-death signal and a reaper: PR_SET_PDEATHSIG only reaches the direct
child, and fires when the *thread* that forked it exits — so tasks must be started from a
thread that lives as long as the job (the supervisor's). The reaper holds the read end of
a pipe from the launcher; when the launcher dies the pipe closes and the reaper kills
every registered group, grandchildren included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Optional

from shoal.launch.errors import StartError
from shoal.launch.plan import TaskPlan

_PR_SET_PDEATHSIG = 1
_REAPER = Path(__file__).with_name("reaper.py")


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _child_setup(parent_pid: int):
    """preexec_fn: ask the kernel to SIGKILL the child when the launcher goes away."""

    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return setup


class Reaper:
    """The job's watchdog process (see reaper.py). `add`/`remove` are thread-safe;
    `close` is idempotent and lets the reaper exit without killing anything that was
    removed."""

    def __init__(self, grace: float = 2.0) -> None:
        self._grace = grace
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the watchdog; blocks for the fork/exec only."""
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(_REAPER), str(self._grace)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def remove(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass


class LocalProcess:
    """One attempt of one task: a process that leads its own process group (session).

    `start` blocks for fork/exec; `wait_exit` blocks until the leader exits but leaves it
    unreaped, so the group id cannot be reused while `stop_group` cleans up leftovers;
    `reap` then frees it. `signal_group` is thread-safe and ignores a group already gone.
    """

    def __init__(self, plan: TaskPlan, *, workdir: str, base_env: Mapping[str, str]) -> None:
        self.plan = plan
        self._workdir = workdir
        self._base_env = base_env
        self._proc: Optional[subprocess.Popen] = None
        self._reaped = False

    def start(self) -> None:
        """Start the task with stdout and stderr on one pipe; StartError if exec fails."""
        env = {**self._base_env, **self.plan.env_dict}
        try:
            self._proc = subprocess.Popen(
                list(self.plan.argv), cwd=self._workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_child_setup(os.getpid()),
            )
        except OSError as e:
            raise StartError(
                f"{self.plan.label}: cannot run {self.plan.argv[0]!r}: {e.strerror}; check"
                f" the command (run:) and the working directory {self._workdir}"
            ) from e

    @property
    def pid(self) -> int:
        assert self._proc is not None, "start() first"
        return self._proc.pid

    @property
    def pgid(self) -> int:
        return self.pid  # start_new_session makes the task its group's leader

    @property
    def stdout(self) -> IO[bytes]:
        assert self._proc is not None and self._proc.stdout is not None
        return self._proc.stdout

    def wait_exit(self) -> int:
        """Block until the leader exits; return its code (-N if killed by signal N)."""
        while True:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                return self._proc.wait() if self._proc else -1
            except InterruptedError:
                continue
            if info is None:
                continue
            if info.si_code == os.CLD_EXITED:
                return info.si_status
            return -info.si_status

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the task's whole process group, unless it is already reaped."""
        if self._proc is None or self._reaped:
            return
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_group(self, grace: float) -> None:
        """After the leader exited: TERM what is left of its group, KILL it after `grace`."""
        if not group_members(self.pgid, exclude=self.pid):
            return
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and group_members(self.pgid, exclude=self.pid):
            time.sleep(0.05)
        self.signal_group(signal.SIGKILL)

    def reap(self) -> None:
        """Collect the exited leader (idempotent); the group id is free after this."""
        if self._proc is not None and not self._reaped:
            self._proc.wait()
            self._reaped = True


def group_members(pgid: int, exclude: int = 0) -> list[int]:
    """Live (non-zombie) processes of group `pgid`, read from /proc; [] elsewhere."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out
