"""`LocalProcess`: one attempt of one task on this machine, leading its own process group,
with the kernel's parent-death signal set.

Linux is the target; on other POSIX systems the parent-death signal is skipped and the
reaper (local_reaper.py) alone cleans up after a dead launcher. PR_SET_PDEATHSIG fires
when the *thread* that forked the child exits, so tasks must be started from a thread that
lives as long as the job.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from typing import IO, Optional

from shoal.launch.errors import StartError
from shoal.launch.parent_death import die_with_parent
from shoal.launch.plan import TaskPlan
from shoal.launch.processes import stop_group

_POLL = 0.05


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
                start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
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

    def wait_exit(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block until the leader exits (at most `timeout` seconds when given); return its
        code (-N if killed by signal N), None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        flags = os.WEXITED | os.WNOWAIT | (0 if deadline is None else os.WNOHANG)
        while True:
            try:
                info = os.waitid(os.P_PID, self.pid, flags)
            except ChildProcessError:
                return self._proc.wait() if self._proc else -1
            except InterruptedError:
                continue
            if info is not None:
                return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if deadline is not None:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(_POLL)

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
        stop_group(self.pgid, grace, exclude=self.pid)

    def reap(self) -> None:
        """Collect the exited leader (idempotent); the group id is free after this."""
        if self._proc is not None and not self._reaped:
            self._proc.wait()
            self._reaped = True
