"""`run_job`: run a planned job in the foreground — records, console, supervisor and the
launcher's signal handling wired together. Blocks until the job is over.

Must be called from the main thread (it installs SIGINT/SIGTERM/SIGHUP handlers: the
first asks the supervisor to stop the job, a second skips the grace period).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import IO

from shoal.launch.console import ConsoleObserver, Observers, RecordsObserver, process_started
from shoal.launch.logmux import LogMux
from shoal.launch.plan import JobPlan
from shoal.launch.records import JobStore
from shoal.launch.supervisor import JobResult, Supervisor

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_job(plan: JobPlan, *, store: JobStore, out: IO[bytes], base_env: Mapping[str, str],
            live_status: bool = False) -> JobResult:
    """Record the job, run it, record how it ended; returns the JobResult."""
    os.makedirs(os.path.join(plan.job_dir, "logs"), exist_ok=True)
    os.makedirs(plan.model_dir, exist_ok=True)
    store.create_job(plan, os.getpid(), process_started(os.getpid()) or 0.0)
    console_holder: list = []  # the console needs the mux, the mux's callback the console
    records = RecordsObserver(plan, store)

    def on_progress(name: str, step: int, loss: float) -> None:
        console_holder[0].progress(name, step, loss)
        records.progress(name, step, loss)

    mux = LogMux(out, on_progress=on_progress, live_status=live_status)
    console = ConsoleObserver(plan, mux, live=live_status)
    console_holder.append(console)
    mux.note(f"shoal | job {plan.job_id}: {len(plan.tasks)} tasks, logs in {plan.job_dir}/logs")
    supervisor = Supervisor(plan, base_env=base_env, mux=mux,
                            observer=Observers(console, records))

    def on_signal(signum: int, _frame: object) -> None:
        supervisor.request_stop(f"the launcher got {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    try:
        result = supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    store.set_job_state(plan.job_id, result.state.value, result.reason,
                        exit_code=result.exit_code, ended=True)
    return result
