"""TensorBoard for a recorded job: which directories to serve (`logdir_flags`, from what
the tasks reported, pure) and running it so that stopping `shoal tensorboard` stops it too
(`run_in_group`).

Tasks report their summaries directory with a `summaries=DIR` line (logmux.py), recorded
per task. Served: the one reported directory that holds all the others (Shoal's layout:
the chief's model dir, other workers below it); several unrelated ones each under its task's
name (`--logdir_spec`); none reported, or none of them on this machine (a task on another
host): the job's model dir.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from shoal.launch.parent_death import die_with_parent
from shoal.launch.processes import stop_group
from shoal.launch.records import JobRecord

STOP_GRACE = 5.0
"""Seconds TensorBoard gets to exit after SIGTERM before its group is SIGKILLed."""

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def logdir_flags(job: JobRecord, is_dir: Callable[[str], bool] = os.path.isdir) -> tuple[list[str], str]:
    """TensorBoard's flags for the job's summaries and a few words that say what they
    serve. `is_dir` tells whether a reported directory is on this machine."""
    reported = [(t.name, t.summaries) for t in job.tasks if t.summaries and is_dir(t.summaries)]
    if not reported:
        return ["--logdir", job.model_dir], f"the model dir {job.model_dir}"
    dirs = list(dict.fromkeys(directory for _, directory in reported))
    root = os.path.commonpath(dirs)
    if root in dirs:
        return ["--logdir", root], root
    spec = ",".join(f"{name}:{directory}" for name, directory in reported)
    return ["--logdir_spec", spec], ", ".join(f"{name} in {d}" for name, d in reported)


class _Stop(Exception):
    """Raised in the main thread by a stop signal, to end the wait."""


def run_in_group(argv: Sequence[str], environ: Mapping[str, str], *,
                 grace: float = STOP_GRACE) -> Optional[int]:
    """Run `argv` as the leader of a new process group (and session) and wait for it.
    Returns its exit code, or None if SIGINT/SIGTERM/SIGHUP to this process stopped it
    first: then its whole group gets TERM, `grace`, KILL. It is SIGKILLed if this process
    dies without stopping it. Blocks. Stop signals are caught only on the main thread (the
    previous handlers come back afterwards); elsewhere the caller must stop it."""
    proc = subprocess.Popen(list(argv), env=dict(environ), start_new_session=True,
                            preexec_fn=die_with_parent(os.getpid()))
    previous: dict[int, object] = {}

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stop(signum)

    try:
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
        return proc.wait()
    except (_Stop, KeyboardInterrupt):
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        stop_group(proc.pid, grace)
        if proc.poll() is None:
            proc.wait()
