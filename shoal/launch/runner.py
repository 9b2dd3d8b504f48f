"""`run_job`: run a planned job in the foreground — records, console, supervisor, executor
and the launcher's signal handling wired together. Blocks until the job is over.

Must be called from the main thread (it installs signal handlers). SIGINT and SIGTERM ask
the supervisor to stop the job (a second one skips the grace period). SIGHUP — the terminal
closed, the ssh session dropped — does not stop it: the launcher moves what it wrote to the
terminal into `<job dir>/launcher.log` (launcher_output.py) and the job runs on; `shoal attach`
follows it again. `shoal scale` reaches the job through request files in its folder, which
a `ScaleInbox` hands to the supervisor (scale_requests.py); ps:0's membership lines are
recorded for `shoal status`. The caller owns the executor and closes it afterwards.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import IO, Callable

from shoal.launch.console import ConsoleObserver, Observers, RecordsObserver
from shoal.launch.errors import WorkspaceError
from shoal.launch.executor import Executor
from shoal.launch.files import private_dirs
from shoal.launch.launcher_output import launcher_log_path, move_terminal_output
from shoal.launch.logmux import LogMux
from shoal.launch.membership_line import MembershipLine
from shoal.launch.plan import JobPlan
from shoal.launch.progress_line import ProgressLine
from shoal.launch.processes import process_started
from shoal.launch.records import JobStore
from shoal.launch.resume_hint import resume_hint
from shoal.launch.root_cause import report_root_cause
from shoal.launch.scale_requests import ScaleInbox
from shoal.launch.stop_signals import StopSignals
from shoal.launch.supervisor import JobResult, Supervisor
from shoal.launch.watchdog import Watchdog
from shoal.wording import counted

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MEMBERSHIP_REPORTER = "ps.0"
"""The task whose membership lines the records keep (every ps logs its own; ps:0's is the job's)."""


def run_job(plan: JobPlan, *, executor: Executor, store: JobStore, out: IO[bytes],
            live_status: bool = False, stop_pending: Callable[[], int | None] = lambda: None) -> JobResult:
    """Make the job's folders, record the job, run it; returns the JobResult (the
    records hold its end state; the exit code is the caller's to record). `stop_pending()`,
    asked once the runner's signal handlers are in place, gives the stop signal (SIGTERM,
    SIGINT) that came before, if one did (the caller deferred it: setup_signals.stops_deferred):
    the job is then stopped at once, as by that signal."""
    private_dirs(Path(plan.job_dir) / "logs", "the job's folder",
                 "set SHOAL_HOME to a writable directory (default ~/.shoal)")
    private_dirs(Path(plan.model_dir), "the model dir", "pick a writable output_dir (--output-dir), or leave it"
                 " out to use the job's folder")
    number = store.create_job(plan, os.getpid(), process_started(os.getpid()) or 0.0,
                              executor=executor.kind)
    console_holder: list = []  # the console needs the mux, the mux's callback the console

    watchdog = Watchdog.for_spec(plan.watchdog, [(t.name, t.argv) for t in plan.tasks],
                                 f"{plan.primary.job}.{plan.primary.index}", time.monotonic)

    def on_progress(name: str, line: ProgressLine) -> None:
        if watchdog is not None:
            watchdog.progress(name, line.step)
        console_holder[0].progress(name, line.step, line.loss)
        records.progress(name, line.step, line.loss)
        records.task_progress(name, line)

    def on_summaries(name: str, directory: str) -> None:
        records.summaries(name, directory)

    def on_membership(name: str, line: MembershipLine) -> None:
        if name == MEMBERSHIP_REPORTER:
            records.membership(line)

    mux = LogMux(out, on_progress=on_progress, on_summaries=on_summaries,
                 on_waiting=watchdog.waiting if watchdog is not None else None,
                 on_membership=on_membership, live_status=live_status)
    records = RecordsObserver(plan, store, notify=mux.note)  # the callbacks above find it when called
    console = ConsoleObserver(plan, mux, live=live_status)
    console_holder.append(console)
    mux.note(f"shoal | job {number} {plan.job_id}: {counted(len(plan.tasks), 'task')}, logs in {plan.job_dir}/logs"
             f" (shoal logs {number})")
    supervisor = Supervisor(plan, executor=executor, mux=mux,
                            observer=Observers(console, records), watchdog=watchdog)

    on_signal = StopSignals(plan.job_dir, supervisor.request_stop)

    def on_hangup(_signum: int, _frame: object) -> None:  # prints: not in the handler (see call_soon)
        supervisor.call_soon(hung_up)

    def hung_up() -> None:
        path = launcher_log_path(plan.job_dir)
        try:
            moved = move_terminal_output(path)
        except (WorkspaceError, OSError):
            moved = False  # the console's writers ignore a dead terminal; the task logs have it all
        console.set_live(False)
        mux.set_live(False)
        where = f"; its output goes on in {path}" if moved else ""
        mux.note(f"shoal | the terminal hung up (SIGHUP); job {plan.job_id} keeps running{where};"
                 f" follow it with shoal attach {plan.job_id}")

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    pending = stop_pending()
    if pending is not None:  # a stop signal before the handlers were in place
        on_signal(pending)
    inbox = ScaleInbox(plan.job_dir, supervisor.request_scale)
    inbox.start()
    try:
        result = supervisor.run()
        report_root_cause(result.failure, plan.job_dir, mux.note)
        hint = resume_hint(plan, result)
        if hint:
            mux.note(hint)
        return result
    finally:
        inbox.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
