"""`SlurmReaper`: the launcher's side of the Slurm watchdog (`slurm_watchdog.py`), which
scancels every registered step and job when the launcher dies, however it dies.

The watchdog holds the read end of a pipe from the launcher; `add` and `remove` write "+ID" /
"-ID" lines as steps start and end and jobs are submitted and cancelled, and `add_name` /
`remove_name` "+name:NAME" / "-name:NAME" lines for a job being submitted, whose id sbatch has
not said yet. When the pipe closes — `close`, or the kernel closing it because the launcher
died — the watchdog scancels every id and every job of a name still registered.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from shoal.launch.slurm import check_step_id, check_submit_name
from shoal.launch.watchdog_pipe import WatchdogPipe

_SCRIPT = Path(__file__).with_name("slurm_watchdog.py")


class SlurmReaper(WatchdogPipe):
    """The job's Slurm watchdog (see WatchdogPipe). `add`/`remove` take a Slurm job or step id
    ("12", "12.3"); `close` waits up to 70 s, as scancel of several steps can take a while, and
    then leaves a watchdog still at work to it (against a slurmctld that does not answer it tries
    again for up to 30 minutes: slurm_watchdog.RETRY_S)."""

    def __init__(self, env: Mapping[str, str], python: str = sys.executable) -> None:
        super().__init__([python, "-I", str(_SCRIPT)], env=env, close_timeout=70.0, kill_after_close=False)

    def add(self, slurm_id: str) -> None:
        """Cancel job or step `slurm_id` if the launcher dies."""
        super().add(check_step_id(slurm_id))

    def remove(self, slurm_id: str) -> None:
        super().remove(check_step_id(slurm_id))

    def add_name(self, name: str) -> None:
        """Cancel every job called `name` (a name `slurm.submit_name` made) if the launcher dies:
        for a job submitted before its id is known."""
        super().add(f"name:{check_submit_name(name)}")

    def remove_name(self, name: str) -> None:
        super().remove(f"name:{check_submit_name(name)}")
