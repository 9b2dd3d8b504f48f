"""`Supervisor`: runs a JobPlan's tasks and applies the job's policies.

Teardown policy: the chief (chief:0, else worker:0) succeeding with a chief job, or every
worker succeeding without one, makes the job SUCCEEDED and stops the rest (ps servers,
evaluators); any chief/worker/ps task failing for good stops every task and makes the job
FAILED with the chief's exit code if the chief failed, else 1; an evaluator's failure is
reported and ignored. Restart policy: a task exiting non-zero is restarted with the same
identity (argv, address, TF_CONFIG) after a doubling backoff, up to max_restarts times.
Deadline: past it every task stops and the job FAILS with code 124. Stopping is
TERM to the task's process group -> grace period -> KILL.

`run` blocks until the job is over and must be called from a thread that outlives the
job (tasks die with the thread that forked them, see executor_local). `request_stop` is
the only thread- and signal-safe method.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from shoal.launch.errors import StartError
from shoal.launch.executor_local import LocalProcess, Reaper
from shoal.launch.logmux import LogMux
from shoal.launch.plan import JobPlan, TaskPlan
from shoal.launch.spec import RestartPolicy
from shoal.launch.states import JOB_TRANSITIONS, TASK_TRANSITIONS, JobState, TaskState

log = logging.getLogger(__name__)

EXIT_DEADLINE = 124
EXIT_KILLED = 130
EXIT_START_FAILED = 127
_MAX_BACKOFF = 30.0
_KILL_WAIT = 5.0


@dataclass(frozen=True)
class JobResult:
    """How a job ended: its final state, the exit code for the launcher, and why."""

    state: JobState
    exit_code: int
    reason: str


class JobObserver(Protocol):
    """Told about every state change, from the supervisor's thread."""

    def job_changed(self, state: JobState, reason: str) -> None: ...

    def task_changed(self, task: TaskPlan, old: TaskState, new: TaskState, detail: str,
                     pid: Optional[int], restarts: int) -> None: ...


@dataclass
class _Slot:
    plan: TaskPlan
    state: TaskState = TaskState.PENDING
    proc: Optional[LocalProcess] = None
    attempt: int = 0
    restarts: int = 0
    restart_at: float = 0.0
    stopping: bool = False


def describe_exit(code: int) -> str:
    """"exit 1" or "killed by SIGTERM"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class Supervisor:
    """Runs one job to its end. Not reusable: one `run` per instance."""

    def __init__(self, plan: JobPlan, *, base_env: Mapping[str, str], mux: LogMux,
                 observer: JobObserver, clock: Callable[[], float] = time.monotonic) -> None:
        self._plan = plan
        self._base_env = base_env
        self._mux = mux
        self._observer = observer
        self._clock = clock
        self._slots = {t.name: _Slot(t) for t in plan.tasks}
        self._events: queue.Queue = queue.Queue()
        self._reaper = Reaper(grace=min(plan.grace_period, 3.0))
        self._job_state = JobState.PENDING
        self._result: Optional[JobResult] = None
        self._stop_reason: Optional[str] = None
        self._force = False
        self._finishing = False

    def request_stop(self, reason: str = "stopped by request", force: bool = False) -> None:
        """Ask `run` to stop every task and end the job KILLED; a second call (or
        force=True) skips the grace period. Safe from signal handlers and other threads."""
        if self._stop_reason is not None:
            self._force = True
        self._force = self._force or force
        self._stop_reason = reason

    def run(self) -> JobResult:
        """Start every task, supervise until the job is over, stop what is left; blocks."""
        self._reaper.start()
        try:
            self._set_job(JobState.RUNNING, "")
            deadline = self._clock() + self._plan.deadline if self._plan.deadline else None
            for slot in self._slots.values():
                if self._result is None and self._stop_reason is None:
                    self._start(slot)
            while self._result is None:
                self._step(deadline)
            return self._result
        finally:
            self._last_resort()
            self._reaper.close()

    # --- the loop -------------------------------------------------------------------

    def _step(self, deadline: Optional[float]) -> None:
        if self._stop_reason is not None:
            self._finish(JobState.KILLED, EXIT_KILLED, self._stop_reason)
            return
        now = self._clock()
        if deadline is not None and now >= deadline:
            self._finish(JobState.FAILED, EXIT_DEADLINE,
                         f"deadline of {self._plan.deadline:g}s exceeded")
            return
        timeout = 0.1
        for slot in self._slots.values():
            if slot.state is TaskState.RESTARTING:
                if slot.restart_at <= now:
                    self._start(slot)
                    if self._result is not None:
                        return
                else:
                    timeout = min(timeout, slot.restart_at - now)
        try:
            event = self._events.get(timeout=max(timeout, 0.001))
        except queue.Empty:
            return
        self._on_exit(*event)

    def _start(self, slot: _Slot) -> None:
        self._move(slot, TaskState.STARTING, "")
        slot.attempt += 1
        slot.stopping = False
        proc = LocalProcess(slot.plan, workdir=self._plan.workdir, base_env=self._base_env)
        try:
            proc.start()
        except StartError as e:
            self._move(slot, TaskState.FAILED, str(e))
            self._finish(JobState.FAILED, EXIT_START_FAILED, str(e))
            return
        slot.proc = proc
        self._reaper.add(proc.pgid)
        # Observers hear of RUNNING before the watcher exists, so the process cannot have
        # been reaped yet and its pid still names it (records read its create time).
        self._move(slot, TaskState.RUNNING, f"pid {proc.pid}", pid=proc.pid)
        reader = self._mux.attach(slot.plan.label, slot.plan.name, proc.stdout,
                                  slot.plan.log_path)
        threading.Thread(
            target=self._watch, args=(slot.plan.name, slot.attempt, proc, reader),
            name=f"watch-{slot.plan.name}", daemon=True,
        ).start()

    def _watch(self, name: str, attempt: int, proc: LocalProcess,
               reader: threading.Thread) -> None:
        code = proc.wait_exit()
        proc.stop_group(self._plan.grace_period)
        self._reaper.remove(proc.pgid)  # before reaping: after it the pgid may be reused
        proc.reap()
        reader.join(timeout=2.0)
        self._events.put((name, attempt, code))

    def _on_exit(self, name: str, attempt: int, code: int) -> None:
        slot = self._slots[name]
        if attempt != slot.attempt or slot.state is not TaskState.RUNNING:
            return
        detail = describe_exit(code)
        if slot.stopping or self._finishing:
            self._move(slot, TaskState.SUCCEEDED if code == 0 else TaskState.KILLED, detail)
            return
        if code == 0:
            self._move(slot, TaskState.SUCCEEDED, detail)
            self._check_success()
            return
        restart = self._plan.restart
        if restart.policy is RestartPolicy.ON_FAILURE and slot.restarts < restart.max_restarts:
            delay = min(restart.backoff * 2 ** slot.restarts, _MAX_BACKOFF)
            slot.restarts += 1
            slot.restart_at = self._clock() + delay
            self._move(slot, TaskState.RESTARTING,
                       f"{detail}; restart {slot.restarts}/{restart.max_restarts} in {delay:g}s")
            return
        self._move(slot, TaskState.FAILED, detail)
        if slot.plan.task.job == "evaluator":
            self._mux.note(f"shoal | {slot.plan.label} failed; an evaluator does not stop the job")
            return
        is_primary = slot.plan.task == self._plan.primary
        job_code = (code if code > 0 else 128 - code) if is_primary else 1
        self._finish(JobState.FAILED, job_code, f"{slot.plan.label} failed ({detail})")

    def _check_success(self) -> None:
        chief = self._slots.get("chief.0")
        if chief is not None:
            done = chief.state is TaskState.SUCCEEDED
        else:
            done = all(s.state is TaskState.SUCCEEDED for s in self._slots.values()
                       if s.plan.task.job == "worker")
        if done:
            self._finish(JobState.SUCCEEDED, 0, "all training tasks succeeded")

    # --- teardown -------------------------------------------------------------------

    def _finish(self, state: JobState, exit_code: int, reason: str) -> None:
        """Stop every task (TERM, grace, KILL), then record the job's end."""
        if self._finishing:
            return
        self._finishing = True
        live = []
        for slot in self._slots.values():
            if slot.state in (TaskState.PENDING, TaskState.RESTARTING):
                self._move(slot, TaskState.KILLED, "job stopped before it ran")
            elif slot.state is TaskState.RUNNING and slot.proc is not None:
                slot.stopping = True
                live.append(slot)
        if live:
            self._mux.note(f"shoal | {self._plan.name}: {reason}; stopping"
                           f" {', '.join(s.plan.name for s in live)}")
        for slot in live:
            slot.proc.signal_group(signal.SIGTERM)  # type: ignore[union-attr]
        self._drain(self._plan.grace_period)
        for slot in self._slots.values():
            if slot.state is TaskState.RUNNING and slot.proc is not None:
                slot.proc.signal_group(signal.SIGKILL)
        self._drain(_KILL_WAIT, force_ok=False)
        for slot in self._slots.values():
            if slot.state is TaskState.RUNNING:
                log.warning("%s did not exit after SIGKILL", slot.plan.label)
                self._move(slot, TaskState.KILLED, "did not exit after SIGKILL")
        self._set_job(state, reason)
        self._result = JobResult(state, exit_code, reason)

    def _drain(self, seconds: float, force_ok: bool = True) -> None:
        end = self._clock() + seconds
        while any(s.state is TaskState.RUNNING for s in self._slots.values()):
            if force_ok and self._force:
                return
            left = end - self._clock()
            if left <= 0:
                return
            try:
                event = self._events.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            self._on_exit(*event)

    def _last_resort(self) -> None:
        """On the way out (even by exception): no task process may survive run()."""
        for slot in self._slots.values():
            if slot.proc is not None and slot.state is TaskState.RUNNING:
                slot.proc.signal_group(signal.SIGKILL)

    # --- state bookkeeping ----------------------------------------------------------

    def _move(self, slot: _Slot, new: TaskState, detail: str, pid: Optional[int] = None) -> None:
        old = slot.state
        if new not in TASK_TRANSITIONS[old]:
            raise AssertionError(f"{slot.plan.name}: illegal transition {old} -> {new}")
        slot.state = new
        self._observer.task_changed(slot.plan, old, new, detail, pid, slot.restarts)

    def _set_job(self, state: JobState, reason: str) -> None:
        if state not in JOB_TRANSITIONS[self._job_state]:
            raise AssertionError(f"illegal job transition {self._job_state} -> {state}")
        self._job_state = state
        self._observer.job_changed(state, reason)
