"""Observers of a running job: `ConsoleObserver` prints state changes and progress,
`RecordsObserver` writes them to the JobStore, `Observers` fans out to several.

Called from the supervisor's thread (state changes) and from log-reader threads
(progress); each keeps its own lock where it has state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Optional

from shoal.launch.executor import TaskRef
from shoal.launch.logmux import LogMux
from shoal.launch.membership_line import MembershipLine
from shoal.launch.plan import JobPlan, TaskPlan
from shoal.launch.progress_line import ProgressLine
from shoal.launch.records import JobStore
from shoal.launch.records_writer import RecordsWriter
from shoal.launch.states import JobState, TaskState, running_of

_PLAIN_PROGRESS_EVERY = 10.0
_RECORD_PROGRESS_EVERY = 1.0


class ConsoleObserver:
    """Prints "shoal | mnist.worker.1: STARTING -> RUNNING (pid 42)" lines and keeps a
    progress line: live at the bottom of a terminal, else a plain line every 10 s."""

    def __init__(self, plan: JobPlan, mux: LogMux, *, live: bool) -> None:
        self._plan = plan
        self._mux = mux
        self._live = live
        self._lock = threading.Lock()
        self._states: dict[str, TaskState] = {t.name: TaskState.PENDING for t in plan.tasks}
        self._step: Optional[tuple[int, float, str]] = None
        self._started = time.monotonic()
        self._last_plain = 0.0

    def set_live(self, live: bool) -> None:
        """Keep the progress line live at the bottom (a terminal), or print it every 10 s."""
        self._live = live

    def job_changed(self, state: JobState, reason: str) -> None:
        if state.is_terminal:
            self._mux.clear_status()
        why = f" ({reason})" if reason else ""
        self._mux.note(f"shoal | job {self._plan.job_id}: {state.value}{why}")

    def task_changed(self, task: TaskPlan, old: TaskState, new: TaskState, detail: str,
                     ref: Optional[TaskRef], restarts: int) -> None:
        with self._lock:
            self._states[task.name] = new
        why = f" ({detail})" if detail else ""
        self._mux.note(f"shoal | {task.label}: {old.value} -> {new.value}{why}")
        self._draw()

    def task_added(self, task: TaskPlan) -> None:
        with self._lock:
            self._states[task.name] = TaskState.PENDING

    def progress(self, name: str, step: int, loss: float) -> None:
        with self._lock:
            if self._step is None or step >= self._step[0]:
                self._step = (step, loss, name)
        now = time.monotonic()
        if self._live:
            self._draw()
        elif now - self._last_plain >= _PLAIN_PROGRESS_EVERY:
            self._last_plain = now
            self._mux.note(f"shoal | {self._status_text()}")

    def _draw(self) -> None:
        if self._live:
            self._mux.set_status(self._status_text())

    def _status_text(self) -> str:
        with self._lock:
            running = running_of(self._states.values())
            step = self._step
        elapsed = int(time.monotonic() - self._started)
        text = f"[{self._plan.name} {elapsed // 60}:{elapsed % 60:02d}] {running}"
        if step is not None:
            text += f" | step {step[0]} loss {step[1]:.4g} ({step[2]})"
        return text


class RecordsObserver:
    """Writes state changes, every started process and the progress (the highest step
    seen; at most once a second, and once more when the job ends) to the JobStore, and each
    task's straggler figures from its progress lines (at most once a second per task, and
    once more when the job ends). A write the records cannot take (a full disk) is said
    through `notify` and does not end the job (records_writer.py)."""

    def __init__(self, plan: JobPlan, store: JobStore, notify: Callable[[str], None]) -> None:
        self._job_id = plan.job_id
        self._store = store
        self._writer = RecordsWriter(notify)
        self._last = 0.0
        self._pending: Optional[tuple[int, float]] = None
        self._best = -1
        self._lock = threading.Lock()
        self._task_last: dict[str, float] = {}
        self._task_pending: dict[str, tuple[ProgressLine, float]] = {}

    def job_changed(self, state: JobState, reason: str) -> None:
        if state.is_terminal:
            self._flush_progress()
            with self._lock:
                pending, self._task_pending = self._task_pending, {}
            for name, (line, at) in pending.items():
                self._write_task(name, line, at)
        self._writer.call(self._store.set_job_state, self._job_id, state, reason, ended=state.is_terminal)

    def task_added(self, task: TaskPlan) -> None:
        self._writer.call(self._store.add_task, self._job_id, task)

    def membership(self, line: MembershipLine) -> None:
        """ps:0 logged `line`: record the job's membership."""
        self._writer.call(self._store.set_membership, self._job_id, line.version, line.tasks_text, line.change,
                          time.time())

    def summaries(self, name: str, directory: str) -> None:
        """Task `name` writes its TensorBoard summaries to `directory` (on its host)."""
        self._writer.call(self._store.set_summaries, self._job_id, name, directory)

    def task_changed(self, task: TaskPlan, old: TaskState, new: TaskState, detail: str,
                     ref: Optional[TaskRef], restarts: int) -> None:
        if ref is not None:
            self._writer.call(self._store.add_process, self._job_id, task.name, ref)
        self._writer.call(self._store.set_task, self._job_id, task.name, new, detail, restarts, ref)

    def progress(self, name: str, step: int, loss: float) -> None:
        now = time.monotonic()
        with self._lock:
            if step < self._best:
                return
            self._best = step
            self._pending = (step, loss)
            if now - self._last < _RECORD_PROGRESS_EVERY:
                return
            self._last = now
        self._flush_progress()

    def task_progress(self, name: str, line: ProgressLine) -> None:
        """Task `name` printed `line`: record its straggler figures (a line with none, such as
        the `final` line, leaves the last ones to be recorded)."""
        if line.step_ms is None and line.p95_ms is None and line.applied is None and line.pushed is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._task_last.get(name, float("-inf")) < _RECORD_PROGRESS_EVERY:
                self._task_pending[name] = (line, time.time())
                return
            self._task_last[name] = now
            self._task_pending.pop(name, None)
        self._write_task(name, line, time.time())

    def _write_task(self, name: str, line: ProgressLine, at: float) -> None:
        self._writer.call(self._store.set_task_progress, self._job_id, name, line.step_ms, line.p95_ms,
                          line.applied, line.pushed, at)

    def _flush_progress(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._writer.call(self._store.set_progress, self._job_id, *pending)


class Observers:
    """Forwards every call to each observer in turn."""

    def __init__(self, *observers: object) -> None:
        self._observers = observers

    def job_changed(self, *args: object) -> None:
        for o in self._observers:
            o.job_changed(*args)  # type: ignore[attr-defined]

    def task_changed(self, *args: object) -> None:
        for o in self._observers:
            o.task_changed(*args)  # type: ignore[attr-defined]

    def task_added(self, *args: object) -> None:
        for o in self._observers:
            o.task_added(*args)  # type: ignore[attr-defined]

    def progress(self, *args: object) -> None:
        for o in self._observers:
            o.progress(*args)  # type: ignore[attr-defined]
