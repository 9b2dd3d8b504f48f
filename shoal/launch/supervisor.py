"""`Supervisor`: runs a JobPlan's tasks through an Executor and applies the job's policies.

Teardown policy: the chief (chief:0, else worker:0) succeeding with a chief job, or every
worker succeeding without one, makes the job SUCCEEDED and stops the rest (ps servers,
evaluators); any chief/worker/ps task failing for good stops every task and makes the job
FAILED (CHIEF_FAILED with the chief's exit code if the chief failed, else TASK_FAILED); an
evaluator's failure is reported and ignored. Restart policy: a task exiting non-zero is
restarted with the same identity (argv, address, TF_CONFIG: the ps list the job started with,
or for an added ps the list it was added with, see below) after a doubling backoff, up
to max_restarts times, except a task that exits 2 (a usage error, as argparse and Python
give for bad arguments or a missing script) within its first second: running it again would
fail the same way. A restart whose lost host still does not answer (HostUnreachableError)
counts as one and is tried again after the next backoff, while restarts are left (while the
executor is still reconnecting it, StartDeferred, the task stays STARTING and the job goes on);
then the task fails for good with the code its lost attempt ended with, as at once when what the job
runs in is over (AllocationEndedError: its Slurm job was cancelled). Deadline: past it every task
stops and the job FAILS (DEADLINE).
Watchdog (shoal/launch/watchdog.py, when given): when the job's step stops advancing, its
`Stall` names the stuck tasks and the spec's action applies — restart-stuck (TERM -> grace
-> KILL the stuck tasks and start them again, same identity, at once), restart-job (stop
every running task, then start them all again: the chief resumes from its checkpoint), or
fail (the job FAILS, STALLED, the first stuck task as its root cause). Each restart counts
toward `watchdog.max_restarts`; a stall after that fails the job.
Stopping is TERM to the task's process group -> grace period -> KILL.
Scaling (`request_scale`, shoal/launch/scaling.py, for roles whose count is a range): up
starts new tasks with fresh indices, each placed by the executor (a TaskPlacer) and given a
TF_CONFIG listing the tasks as they are then plus itself (running tasks keep theirs); down
(workers only) stops the highest-index tasks (TERM, grace, KILL), whose end is SCALED_DOWN:
expected, not restarted, not a failure. The job's ps list (ps_roster.PsRoster, held here)
names every ps that ever ran: an added ps gets it as its `cluster.ps` (so it finds itself at
its index). Every other task — the planned ones, restarted, and added or relocated workers —
lists the ps the job started with: the ps runtime tells them of a ps that joined (its
placement history, docs/checkpoints.md "Adding a ps"), and every task must start from the same
initial placement. An added ps is a ps like the others for the teardown and restart policies. The teardown policy counts the workers that exist now (added
ones count, scaled-down ones do not); the restart policy applies to added tasks as to any.
Relocation (shoal/launch/relocation.py): a worker whose host was lost (its handle says so) is
restarted elsewhere when the restart policy allows: a replacement with a fresh index, placed
and started as a scaled-up task, while the lost one ends MOVED. A replacement that cannot start
where it was placed is placed on the next eligible host; when none is left the job ends
(START_FAILED) naming each host tried and its error.

Policy only: processes, hosts and pipes are the executor's (executor.py), so the policies
are tested with a fake executor and an injected clock. The job ends with an `EndReason`;
`shoal.cli` turns it into an exit code.

`run` blocks until the job is over and must be called from a thread that outlives the
job (the executor may tie tasks to the thread that starts them). `request_stop` is
thread- and signal-safe; `request_scale` thread-safe.
"""

from __future__ import annotations

import collections
import logging
import queue
import signal
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Protocol

from shoal.cluster import TaskId
from shoal.launch.allocation import TaskAllocation
from shoal.launch.errors import (AllocationEndedError, HostUnreachableError, PlanError, ScaleError, StartDeferred,
                                 StartError)
from shoal.launch.executor import Executor, ExitExplaining, HostLossAware, TaskHandle, TaskPlacer, TaskRef
from shoal.launch.logmux import LogMux
from shoal.launch.output import attach_output
from shoal.launch.plan import JobPlan, TaskPlan, added_task
from shoal.launch.ps_roster import PsRoster
from shoal.launch.relocation import movable, moved_detail, moved_note, retry_note, unplaced_note, unstarted_detail
from shoal.launch.scaling import (ScaleOutcome, ScaleRequest, check_request, new_indices, task_word,
                                  to_stop)
from shoal.launch.root_cause import TaskFailure
from shoal.launch.spec import RestartPolicy
from shoal.launch.states import JOB_TRANSITIONS, TASK_TRANSITIONS, JobState, TaskState
from shoal.launch.watchdog import Stall, Watchdog, WatchdogAction
from shoal.wording import counted

log = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0
_KILL_WAIT = 5.0
_POLL = 0.1
_READER_JOIN = 2.0
_DEFERRED_POLL = 0.2
"""How often a start whose host is being reconnected (StartDeferred) asks again."""
USAGE_EXIT = 2
"""The exit code of a usage error (argparse, `python missing.py`)."""
MOVE_TRIES = 3
"""How many hosts a lost worker's replacement is tried on (each try may wait for an agent's
answers, while nothing else of the job is served)."""
USAGE_WINDOW_S = 1.0
"""A task that exits USAGE_EXIT this soon after it started is not restarted."""
TRAINING_OVER = "training was over (every ps had finished), so it would find no ps to train with"
"""Why a chief or worker that fails or stalls after every ps exited 0 is not restarted."""


class EndReason(str, Enum):
    """Why a job ended; `state` is the JobState it ends in."""

    SUCCEEDED = "succeeded"        # the chief, or every worker, succeeded
    CHIEF_FAILED = "chief-failed"  # the chief failed for good; JobResult.chief_exit says how
    TASK_FAILED = "task-failed"    # a worker or ps (not the chief) failed for good
    DEADLINE = "deadline"          # the job ran past its deadline
    STOPPED = "stopped"            # request_stop (a signal to the launcher, shoal kill)
    START_FAILED = "start-failed"  # a task's program could not be started
    STALLED = "stalled"            # the watchdog saw no progress and its action is fail

    @property
    def state(self) -> JobState:
        if self is EndReason.SUCCEEDED:
            return JobState.SUCCEEDED
        return JobState.KILLED if self is EndReason.STOPPED else JobState.FAILED


@dataclass(frozen=True)
class JobResult:
    """How a job ended: why (`reason`, and in words `detail`), and for CHIEF_FAILED the
    chief's exit code (-N: killed by signal N). `failure` is the first task that failed for
    good (its root cause, shoal/launch/root_cause.py), if one did."""

    reason: EndReason
    detail: str
    chief_exit: Optional[int] = None
    failure: Optional[TaskFailure] = None

    @property
    def state(self) -> JobState:
        """The job's final state."""
        return self.reason.state


class JobObserver(Protocol):
    """Told about every state change, from the supervisor's thread."""

    def job_changed(self, state: JobState, reason: str) -> None: ...

    def task_changed(self, task: TaskPlan, old: TaskState, new: TaskState, detail: str,
                     ref: Optional[TaskRef], restarts: int) -> None: ...

    def task_added(self, task: TaskPlan) -> None:
        """`task` joined the job (`shoal scale`); its state changes follow."""
        ...


ScaleReply = Callable[[ScaleOutcome], None]
"""Told the outcome of one `request_scale`, from the supervisor's thread."""


@dataclass
class _Slot:
    plan: TaskPlan
    state: TaskState = TaskState.PENDING
    handle: Optional[TaskHandle] = None
    attempt: int = 0
    started_at: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    stopping: bool = False
    restart_now: bool = False  # the watchdog stops it to start it again
    kill_at: Optional[float] = None  # when a task the watchdog stopped gets SIGKILL
    stall_restarts: int = 0
    scaled_down: bool = False  # `shoal scale` stops it: its end is expected
    last_code: Optional[int] = None  # how its last attempt ended, while it waits for its restart
    start_again_at: Optional[float] = None  # STARTING, its host being reconnected: when to ask again


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

    def __init__(self, plan: JobPlan, *, executor: Executor, mux: LogMux,
                 observer: JobObserver, clock: Callable[[], float] = time.monotonic,
                 watchdog: Optional[Watchdog] = None) -> None:
        self._plan = plan
        self._watchdog = watchdog
        self._watchdog_restarts = 0
        self._executor = executor
        self._mux = mux
        self._observer = observer
        self._clock = clock
        self._slots = {t.name: _Slot(t) for t in plan.tasks}
        self._ps = PsRoster.of_tasks(plan.tasks)  # every ps that ever ran: the one list of them
        self._started_ps = self._ps  # the ps the job started with: every task but an added ps lists these
        self._events: queue.Queue = queue.Queue()
        self._job_state = JobState.PENDING
        self._result: Optional[JobResult] = None
        self._stop_reason: Optional[str] = None
        self._force = False
        self._force_said = False
        self._soon: collections.deque[Callable[[], None]] = collections.deque()
        self._finishing = False
        self._failure: Optional[TaskFailure] = None
        self._scale_requests: queue.Queue = queue.Queue()

    def request_scale(self, request: ScaleRequest, reply: ScaleReply) -> None:
        """Ask `run` to apply `request` (shoal/launch/scaling.py); `reply` gets the outcome
        from the supervisor's thread, once the new tasks started or the stopping ones were
        signalled (an error outcome if the job ends first). Thread-safe; never blocks."""
        self._scale_requests.put((request, reply))

    def request_stop(self, reason: str = "stopped by request", force: bool = False) -> None:
        """Ask `run` to stop every task and end the job KILLED; a second call (or
        force=True) skips the grace period. Safe from signal handlers and other threads."""
        if self._stop_reason is not None:
            self._force = True
        self._force = self._force or force
        self._stop_reason = reason

    def call_soon(self, work: Callable[[], None]) -> None:
        """Run `work` on the thread that runs the job, within _POLL seconds: for a signal
        handler, which must not print (the output's lock may be held by the very code it
        interrupted). Safe from signal handlers and other threads."""
        self._soon.append(work)

    def run(self) -> JobResult:
        """Start every task, supervise until the job is over, stop what is left; blocks.
        The executor stays open (its owner closes it)."""
        try:
            self._set_job(JobState.RUNNING, "")
            deadline = self._clock() + self._plan.deadline if self._plan.deadline else None
            for slot in list(self._slots.values()):
                if self._result is None and self._stop_reason is None and slot.state is TaskState.PENDING:
                    self._start(slot)  # not one scaled down before it started
            while self._result is None:
                self._step(deadline)
            return self._result
        finally:
            self._refuse_scales("the job ended")
            self._last_resort()

    # --- the loop -------------------------------------------------------------------

    def _run_soon(self) -> None:
        while self._soon:
            self._soon.popleft()()

    def _step(self, deadline: Optional[float]) -> None:
        self._run_soon()
        if self._stop_reason is not None:
            self._finish(EndReason.STOPPED, self._stop_reason)
            return
        self._serve_scales()
        if self._result is not None:
            return
        now = self._clock()
        if deadline is not None and now >= deadline:
            self._finish(EndReason.DEADLINE,
                         f"deadline of {self._plan.deadline:g}s exceeded")
            return
        restarting = any(s.state in (TaskState.RESTARTING, TaskState.STARTING) for s in self._slots.values())
        if self._watchdog is not None and not restarting:  # a task coming back holds up the step: not a stall
            stall = self._watchdog.check(
                s.plan.name for s in self._slots.values() if s.state is TaskState.RUNNING)
            if stall is not None:
                self._on_stall(stall)
                if self._result is not None:
                    return
                now = self._clock()
        timeout = _POLL
        for slot in self._slots.values():
            if slot.kill_at is not None and slot.state is TaskState.RUNNING and slot.handle is not None:
                if slot.kill_at <= now:
                    slot.handle.signal(signal.SIGKILL)
                    slot.kill_at = None
                else:
                    timeout = min(timeout, slot.kill_at - now)
            if slot.state is TaskState.STARTING and slot.start_again_at is not None:
                if slot.start_again_at <= now:
                    self._start_again(slot)
                    if self._result is not None:
                        return
                else:
                    timeout = min(timeout, slot.start_again_at - now)
            if slot.state is TaskState.RESTARTING:
                if slot.restart_at <= now and self._training_over(slot):  # the last ps ended meanwhile
                    code = slot.last_code
                    self._give_up(slot, code, f"{describe_exit(code or 0)}; not restarted: {TRAINING_OVER}")
                    if self._result is not None:
                        return
                elif slot.restart_at <= now:
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
        self._starting(slot)
        self._try_start(slot)

    def _start_again(self, slot: _Slot) -> None:
        """`slot`'s start was deferred (its host being reconnected): ask the executor again,
        unless training ended meanwhile."""
        slot.start_again_at = None
        if self._training_over(slot):
            code = slot.last_code
            self._give_up(slot, code, f"{describe_exit(code or 0)}; not restarted: {TRAINING_OVER}")
            return
        self._try_start(slot)

    def _try_start(self, slot: _Slot) -> None:
        """Have the executor start `slot` (STARTING). A start it defers (StartDeferred: the
        host is being reconnected in the background) leaves the slot STARTING, asked again after
        _DEFERRED_POLL seconds, while the loop serves the rest of the job; it counts no restart."""
        try:
            handle = self._executor.start(self._plan, slot.plan)
        except StartDeferred:
            slot.start_again_at = self._clock() + _DEFERRED_POLL
            return
        except HostUnreachableError as e:
            self._host_still_lost(slot, str(e))
            return
        except AllocationEndedError as e:  # a Slurm job cancelled under the tasks: they failed, for good
            self._give_up(slot, slot.last_code, str(e))
            return
        except StartError as e:
            self._move(slot, TaskState.FAILED, str(e))
            self._failed(slot, None, str(e))
            self._finish(EndReason.START_FAILED, str(e))
            return
        self._running(slot, handle)

    def _starting(self, slot: _Slot) -> None:
        self._move(slot, TaskState.STARTING, "")
        slot.attempt += 1
        slot.stopping = False

    def _running(self, slot: _Slot, handle: TaskHandle) -> None:
        """`slot` (STARTING) runs as `handle`: record it and watch it."""
        slot.handle = handle
        slot.started_at = self._clock()  # after a deferred start too: the usage-error window counts from here
        self._move(slot, TaskState.RUNNING, handle.ref.describe(), ref=handle.ref)
        if slot.attempt > 1 and self._watchdog is not None:  # a restarted task: a fresh window to catch up
            self._watchdog.reset(forget_step=slot.plan.name.split(".")[0] == "ps")
        reader = attach_output(self._mux, slot.plan.label, slot.plan.name, handle.output(),
                               slot.plan.log_path, attempt=slot.attempt)
        threading.Thread(
            target=self._watch, args=(slot.plan.name, slot.attempt, handle, reader),
            name=f"watch-{slot.plan.name}", daemon=True,
        ).start()

    def _watch(self, name: str, attempt: int, handle: TaskHandle,
               reader: threading.Thread) -> None:
        code = handle.wait()
        ended_at = self._clock()
        cause = self._exit_cause(name, handle, code)
        reader.join(timeout=_READER_JOIN)
        handle.close()
        self._events.put((name, attempt, code, ended_at, cause))

    def _exit_cause(self, name: str, handle: TaskHandle, code: int) -> str:
        """What outside `name`'s process ended it (code `code`), as its handle can tell
        (ExitExplaining); "" for an exit 0, a task this supervisor was stopping (its own signal
        ended it), or a handle that cannot tell or fails to. Called from the task's watch thread;
        blocks as the handle's `exit_cause` does. Reads the slot's flags without the main loop's
        care: a stop that begins meanwhile costs one needless query."""
        slot = self._slots.get(name)
        if (not code or not isinstance(handle, ExitExplaining) or slot is None or self._finishing
                or slot.stopping or slot.restart_now or slot.scaled_down or slot.kill_at is not None):
            return ""
        try:
            return handle.exit_cause(code)
        except Exception:  # noqa: BLE001 — the exit must still be reported: without its cause
            log.warning("%s: could not tell what ended it", name, exc_info=True)
            return ""

    def _on_exit(self, name: str, attempt: int, code: int, ended_at: float, cause: str = "") -> None:
        """Take the exit of `name`'s attempt `attempt` with `code` at `ended_at`; `cause`: what
        outside it ended it, if its executor could tell (ExitExplaining)."""
        slot = self._slots[name]
        if attempt != slot.attempt or slot.state is not TaskState.RUNNING:
            return
        detail = describe_exit(code) + (f"; {cause}" if cause else "")
        slot.last_code = code
        if slot.scaled_down:
            slot.kill_at = None
            self._move(slot, TaskState.SCALED_DOWN, f"scaled down ({detail})")
            if not self._finishing:
                self._check_success()
            return
        if slot.stopping or self._finishing:
            self._move(slot, TaskState.SUCCEEDED if code == 0 else TaskState.KILLED, detail)
            return
        if slot.restart_now:
            slot.restart_now, slot.kill_at = False, None
            slot.stall_restarts += 1
            slot.restart_at = self._clock()
            self._move(slot, TaskState.RESTARTING, f"{detail}; restarted by the watchdog")
            return
        if code == 0:
            self._move(slot, TaskState.SUCCEEDED, detail)
            self._check_success()
            return
        restart = self._plan.restart
        restartable = restart.policy is RestartPolicy.ON_FAILURE and slot.restarts < restart.max_restarts
        if restartable and self._training_over(slot):
            detail += f"; not restarted: {TRAINING_OVER}"
            restartable = False
        elif restartable and self._move_elsewhere(slot, detail):
            return
        if code == USAGE_EXIT and ended_at - slot.started_at < USAGE_WINDOW_S:
            if restart.policy is RestartPolicy.ON_FAILURE:
                detail += f" within {USAGE_WINDOW_S:g}s of its start, a usage error: not restarted"
        elif restartable:
            self._restart_later(slot, detail)
            return
        self._give_up(slot, code, detail)

    def _restart_later(self, slot: _Slot, detail: str) -> None:
        """`slot` (RUNNING or STARTING) is RESTARTING: its next attempt after the policy's backoff."""
        restart = self._plan.restart
        delay = min(restart.backoff * 2 ** slot.restarts, _MAX_BACKOFF)
        slot.restarts += 1
        slot.restart_at = self._clock() + delay
        self._move(slot, TaskState.RESTARTING,
                   f"{detail}; restart {slot.restarts}/{restart.max_restarts} in {delay:g}s")

    def _host_still_lost(self, slot: _Slot, why: str) -> None:
        """`slot`'s restart found its lost host still unreachable: it is tried again later while
        its policy has restarts left (a host back after a short outage finds the job going on),
        else it fails for good with the code its lost attempt ended with."""
        restart = self._plan.restart
        if restart.policy is RestartPolicy.ON_FAILURE and slot.restarts < restart.max_restarts:
            if self._training_over(slot):
                why += f"; not restarted: {TRAINING_OVER}"
            else:
                self._restart_later(slot, why)
                return
        self._give_up(slot, slot.last_code, why)

    def _give_up(self, slot: _Slot, code: Optional[int], detail: str) -> None:
        """`slot` failed for good: it is FAILED, and the job ends (but for an evaluator)."""
        self._move(slot, TaskState.FAILED, detail)
        if slot.plan.task.job == "evaluator":
            self._mux.note(f"shoal | {slot.plan.label} failed; an evaluator does not stop the job")
            return
        self._failed(slot, code, detail)
        why = f"{slot.plan.label} failed ({detail})"
        if slot.plan.task == self._plan.primary:
            self._finish(EndReason.CHIEF_FAILED, why, chief_exit=code)
        else:
            self._finish(EndReason.TASK_FAILED, why)

    # --- scaling ------------------------------------------------------------------

    def _serve_scales(self) -> None:
        while True:
            try:
                request, reply = self._scale_requests.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = self._scale(request)
            except ScaleError as e:
                outcome = ScaleOutcome(request.role, request.count, error=str(e))
            except Exception as e:  # a bug must not take the running job down with it
                log.exception("scale request %s failed", request.describe())
                self._mux.note(f"shoal | scale request {request.describe()} failed:"
                               f" {type(e).__name__}: {e} (a bug; the job goes on)")
                outcome = ScaleOutcome(request.role, request.count, error=(
                    f"{request.describe()} failed in the launcher ({type(e).__name__}: {e}); the job"
                    " goes on: shoal status shows what changed, the launcher's log the traceback"))
            reply(outcome)
            if self._result is not None:
                return

    def _refuse_scales(self, why: str) -> None:
        while True:
            try:
                request, reply = self._scale_requests.get_nowait()
            except queue.Empty:
                return
            reply(ScaleOutcome(request.role, request.count,
                               error=f"{request.describe()}: {why} before the request was served"))

    def _scale(self, request: ScaleRequest) -> ScaleOutcome:
        """Apply one scale request (see the module docstring); ScaleError if it cannot be."""
        if self._finishing:
            raise ScaleError(f"{request.describe()}: the job is ending")
        role = request.role
        of_role = [s for s in self._slots.values() if s.plan.task.job == role]
        live = [s for s in of_role if not s.state.is_terminal and not s.scaled_down]
        check_request(request, self._plan.scale_range(role), len(live), self._executor.kind,
                      isinstance(self._executor, TaskPlacer))
        was = len(live)
        if request.count > was:
            started = []
            for index in new_indices((s.plan.task.index for s in of_role), request.count - was):
                slot = self._add(TaskId(role, index))
                if self._result is not None:
                    raise ScaleError(f"{request.describe()}: {slot.plan.label} could not be started,"
                                     " so the job failed (see its log)")
                started.append(task_word(slot.plan.task))
            self._mux.note(f"shoal | scaled {role} to {request.count} (was {was}): started"
                           f" {', '.join(started)}")
            return ScaleOutcome(role, request.count, was, started=tuple(started))
        stopping = []
        if request.count < was:
            kill_at = self._clock() + self._plan.grace_period
            by_task = {s.plan.task: s for s in live}
            for task in to_stop(list(by_task), was - request.count, self._plan.primary):
                slot = by_task[task]
                slot.scaled_down = True
                stopping.append(task_word(task))
                if slot.state is TaskState.RUNNING and slot.handle is not None:
                    slot.stopping, slot.kill_at = True, kill_at
                    slot.handle.signal(signal.SIGTERM)
                elif slot.state in (TaskState.RESTARTING, TaskState.PENDING) or slot.start_again_at is not None:
                    slot.start_again_at = None
                    self._move(slot, TaskState.SCALED_DOWN, "scaled down before it ran (again)")
            self._mux.note(f"shoal | scaling {role} to {request.count} (was {was}): stopping"
                           f" {', '.join(stopping)}")
            self._check_success()  # as when a running one ends: those left may all be done
        return ScaleOutcome(role, request.count, was, stopping=tuple(stopping))

    def _add(self, task: TaskId) -> _Slot:
        """Place, plan, record and start a new task; its slot (a failed start fails the job, as
        for any task)."""
        assert isinstance(self._executor, TaskPlacer)
        try:
            place = self._executor.place_task(
                self._plan, task, [s.plan for s in self._slots.values() if not s.state.is_terminal])
        except PlanError as e:
            raise ScaleError(f"{task_word(task)} cannot be placed: {e}") from e
        return self._start_added(place)

    def _start_added(self, place: TaskAllocation) -> _Slot:
        """Plan, record and start a task the executor placed while the job runs; its slot. An
        added ps is in the ps list it gets, so that it finds itself there; the job's list takes it
        once its slot exists (a failure before leaves the next ps the same index)."""
        roster = self._ps.added(place.task, place.address) if place.task.job == "ps" else self._ps
        slot = self._added_slot(self._added_plan(place, roster=roster))
        self._ps = roster
        self._start(slot)
        return slot

    def _added_plan(self, place: TaskAllocation, leaving: Optional[_Slot] = None,
                    roster: Optional[PsRoster] = None) -> TaskPlan:
        """The plan of a task placed while the job runs: its TF_CONFIG lists the tasks that
        hold their place now, less `leaving` (a lost task it replaces), plus itself; an added ps
        lists `roster` (the job's ps with it), any other task the ps the job started with."""
        peers = [s.plan for s in self._slots.values()
                 if not s.state.is_terminal and not s.scaled_down and s is not leaving]
        ps = (roster or self._ps) if place.task.job == "ps" else self._started_ps
        return added_task(self._plan, place, peers, ps.addresses)

    def _added_slot(self, plan: TaskPlan, restarts: int = 0) -> _Slot:
        """Record a task added while the job runs (PENDING); its slot."""
        slot = _Slot(plan, restarts=restarts)
        self._slots[plan.name] = slot
        self._observer.task_added(plan)
        return slot

    def _move_elsewhere(self, slot: _Slot, detail: str) -> bool:
        """If `slot` ended because its host was lost and it may move (relocation.py), start its
        replacement on another host and end it MOVED; False (nothing done) otherwise."""
        lost = slot.handle.lost_host if isinstance(slot.handle, HostLossAware) else None
        if lost is None or not movable(slot.plan.task, self._plan.primary) or \
                not isinstance(self._executor, TaskPlacer):
            return False
        role = slot.plan.task.job
        index = new_indices((s.plan.task.index for s in self._slots.values() if s.plan.task.job == role), 1)[0]
        task = TaskId(role, index)
        running = [s.plan for s in self._slots.values() if not s.state.is_terminal and s is not slot]
        tried: list[tuple[str, str]] = []  # (host, why the replacement could not start there)
        while True:  # the replacement is recorded once it started: a host that cannot start it leaves no trace
            if self._stop_reason is not None:
                return False  # the job stops: nothing moves
            if len(tried) >= MOVE_TRIES:
                self._no_host_started(slot, detail, lost, task, tried, gave_up=True)
                return True
            avoid = tuple(node for node, _ in tried)
            try:
                place = self._executor.place_task(self._plan, task, running, avoid=avoid)
            except PlanError as e:
                if tried:
                    self._no_host_started(slot, detail, lost, task, tried)
                    return True
                self._mux.note(unplaced_note(slot.plan.label, lost, str(e)))
                return False
            if place.node in avoid:  # a placer that cannot place elsewhere: none is left
                self._no_host_started(slot, detail, lost, task, tried)
                return True
            plan = self._added_plan(place, leaving=slot)
            try:
                handle = self._executor.start(self._plan, plan)
                break
            except StartError as e:
                tried.append((place.node, str(e)))
                self._mux.note(retry_note(lost, task_word(task), place.node or place.host, str(e)))
        self._move(slot, TaskState.MOVED, moved_detail(detail, lost, place.node, task_word(task)))
        self._mux.note(moved_note(lost, task_word(slot.plan.task), place.node, task_word(task), slot.restarts + 1,
                                  self._plan.restart.max_restarts))
        replacement = self._added_slot(plan, restarts=slot.restarts + 1)
        self._starting(replacement)
        self._running(replacement, handle)
        return True

    def _no_host_started(self, slot: _Slot, detail: str, lost: str, task: TaskId,
                         tried: list[tuple[str, str]], gave_up: bool = False) -> None:
        """No eligible host could start the replacement of `slot` (or none of the MOVE_TRIES tried:
        `gave_up`): it fails, and so does the job."""
        why = unstarted_detail(lost, task_word(task), tried, gave_up)
        self._move(slot, TaskState.FAILED, f"{detail}; {why}")
        self._failed(slot, None, why)
        self._finish(EndReason.START_FAILED, f"{slot.plan.label}: {why}")

    # --- the watchdog -----------------------------------------------------------------

    def _on_stall(self, stall: Stall) -> None:
        """Apply the watchdog's action to a stall (see the module docstring)."""
        assert self._watchdog is not None
        line = stall.describe()
        action = self._watchdog.action
        if action is not WatchdogAction.FAIL and self._watchdog_restarts >= self._watchdog.max_restarts:
            self._mux.note(f"shoal | watchdog: {line}; it restarted"
                           f" {counted(self._watchdog_restarts, 'time')} already (watchdog.max_restarts), so the"
                           f" job fails; allow more with watchdog: {{max_restarts: N}} in the spec, or a longer"
                           f" watchdog.stall")
            action = WatchdogAction.FAIL
        elif (action is not WatchdogAction.FAIL and stall.stuck
              and all(self._training_over(self._slots[n]) for n in stall.stuck)):
            self._mux.note(f"shoal | watchdog: {line}; not restarted: {TRAINING_OVER}; the job fails")
            action = WatchdogAction.FAIL
        elif action is WatchdogAction.FAIL:
            self._mux.note(f"shoal | watchdog: {line}; failing the job")
        if action is WatchdogAction.FAIL:
            slot = self._slots[stall.stuck[0]] if stall.stuck else None
            if self._failure is None and slot is not None:
                self._failure = TaskFailure(slot.plan.name, slot.plan.label, None,
                                            f"stopped by the watchdog: {line}", time.time(),
                                            slot.plan.log_path)
            self._finish(EndReason.STALLED, f"watchdog: {line}")
            return
        self._watchdog_restarts += 1
        if action is WatchdogAction.RESTART_STUCK:
            self._mux.note(f"shoal | watchdog: {line}; restarting {', '.join(stall.stuck)}")
            kill_at = self._clock() + self._plan.grace_period
            for name in stall.stuck:
                slot = self._slots[name]
                if slot.state is TaskState.RUNNING and slot.handle is not None:
                    slot.restart_now, slot.kill_at = True, kill_at
                    slot.handle.signal(signal.SIGTERM)
            self._watchdog.reset()
            return
        self._mux.note(f"shoal | watchdog: {line}; restarting the job")
        live = [s for s in self._slots.values() if s.state is TaskState.RUNNING and s.handle is not None]
        for slot in live:
            slot.restart_now = True
            slot.handle.signal(signal.SIGTERM)  # type: ignore[union-attr]
        self._drain(self._plan.grace_period)
        for slot in live:
            if slot.state is TaskState.RUNNING:
                slot.handle.signal(signal.SIGKILL)  # type: ignore[union-attr]
        self._drain(_KILL_WAIT, force_ok=False)
        stuck = [s.plan.label for s in live if s.state is TaskState.RUNNING]
        if stuck:
            self._mux.note(f"shoal | watchdog: {', '.join(stuck)} did not exit within {_KILL_WAIT:g}s of SIGKILL"
                           " (a process in uninterruptible I/O?); each restarts when it does")
        self._watchdog.reset(forget_step=True)

    def _failed(self, slot: _Slot, code: Optional[int], detail: str) -> None:
        """Remember the first task that failed for good: the job's root cause."""
        if self._failure is None:
            self._failure = TaskFailure(slot.plan.name, slot.plan.label, code, detail, time.time(),
                                        slot.plan.log_path if code is not None else "")

    def _training_over(self, slot: _Slot) -> bool:
        """Whether `slot` is a chief or worker and every ps of the job has exited 0: a Shoal ps
        does so only once the job's training is over, so a replica started again would wait for
        ps that never come back (until the watchdog or its own timeout failed it)."""
        if slot.plan.task.job not in ("chief", "worker"):
            return False
        ps = [s for s in self._slots.values() if s.plan.task.job == "ps" and s.state is not TaskState.MOVED]
        return bool(ps) and all(s.state is TaskState.SUCCEEDED for s in ps)

    def _check_success(self) -> None:
        chief = self._slots.get("chief.0")
        if chief is not None:
            done = chief.state is TaskState.SUCCEEDED
        else:
            workers = [s for s in self._slots.values()
                       if s.plan.task.job == "worker" and not s.scaled_down and s.state is not TaskState.MOVED]
            done = bool(workers) and all(s.state is TaskState.SUCCEEDED for s in workers)
        if done:
            self._finish(EndReason.SUCCEEDED, "all training tasks succeeded")

    # --- teardown -------------------------------------------------------------------

    def _finish(self, reason: EndReason, detail: str, chief_exit: Optional[int] = None) -> None:
        """Stop every task (TERM, grace, KILL), then record the job's end."""
        if self._finishing:
            return
        self._finishing = True
        live = []
        for slot in self._slots.values():
            if slot.state is TaskState.PENDING:
                self._move(slot, TaskState.KILLED, "job stopped before it ran")
            elif slot.state is TaskState.RESTARTING or slot.start_again_at is not None:
                slot.start_again_at = None
                self._move(slot, TaskState.KILLED, "job stopped before its restart")
            elif slot.state is TaskState.RUNNING and slot.handle is not None:
                if not slot.stopping:  # one being stopped already (scaled down) got its SIGTERM
                    live.append(slot)
                slot.stopping = True
        if live:
            self._mux.note(f"shoal | {self._plan.name}: {detail}; stopping"
                           f" {', '.join(s.plan.name for s in live)}")
        for slot in live:
            slot.handle.signal(signal.SIGTERM)  # type: ignore[union-attr]
        self._drain(self._plan.grace_period)
        for slot in self._slots.values():
            if slot.state is TaskState.RUNNING and slot.handle is not None:
                slot.handle.signal(signal.SIGKILL)
        self._drain(_KILL_WAIT, force_ok=False)
        for slot in self._slots.values():
            if slot.state is TaskState.RUNNING:
                log.warning("%s did not exit after SIGKILL", slot.plan.label)
                self._move(slot, TaskState.KILLED, "did not exit after SIGKILL")
        self._set_job(reason.state, detail)
        self._result = JobResult(reason, detail, chief_exit, self._failure)

    def _drain(self, seconds: float, force_ok: bool = True) -> None:
        end = self._clock() + seconds
        while any(s.state is TaskState.RUNNING for s in self._slots.values()):
            self._run_soon()
            if force_ok and self._force:
                if not self._force_said:
                    self._force_said = True
                    self._mux.note("shoal | asked to stop again: SIGKILL to every task now, without waiting out"
                                   " the grace period")
                return
            left = end - self._clock()
            if left <= 0:
                return
            try:
                event = self._events.get(timeout=min(left, _POLL))
            except queue.Empty:
                continue
            self._on_exit(*event)

    def _last_resort(self) -> None:
        """On the way out (even by exception): no task process may survive run()."""
        for slot in self._slots.values():
            if slot.handle is not None and slot.state is TaskState.RUNNING:
                slot.handle.signal(signal.SIGKILL)

    # --- state bookkeeping ----------------------------------------------------------

    def _move(self, slot: _Slot, new: TaskState, detail: str,
              ref: Optional[TaskRef] = None) -> None:
        old = slot.state
        if new not in TASK_TRANSITIONS[old]:
            raise AssertionError(f"{slot.plan.name}: illegal transition {old} -> {new}")
        slot.state = new
        self._observer.task_changed(slot.plan, old, new, detail, ref,
                                    slot.restarts + slot.stall_restarts)

    def _set_job(self, state: JobState, reason: str) -> None:
        if state not in JOB_TRANSITIONS[self._job_state]:
            raise AssertionError(f"illegal job transition {self._job_state} -> {state}")
        self._job_state = state
        self._observer.job_changed(state, reason)
