"""Control of recorded jobs from another process: is the launcher alive, which of the
job's tasks still run, `kill_job`, and `reconcile` for jobs whose launcher died.

Tasks are reached through the executor recorded for the job (its TaskRefs), so a reused
pid is never signalled and tasks elsewhere are found too. The launcher itself always ran
on this machine. An executor that is a `Sweeper` can also find every process of the job on
its hosts (`sweep_job`), whatever became of their groups: `reconcile` kills those too, and
`shoal check` lists them. An executor that cannot answer (a hung slurmctld: TaskStateUnknown)
leaves a job as recorded: `reconcile_jobs` says so beside it, and `kill_job` raises once the
launcher is gone. Blocking where it waits (bounded); thread-safe.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import psutil

from shoal.launch.errors import TaskStateUnknown, WorkspaceError
from shoal.launch.executor import Executor, HostCheck
from shoal.launch.kill_request import mark_kill_requested, withdraw_kill_request
from shoal.launch.processes import same_process
from shoal.launch.records import JobRecord, JobStore, ProcessRecord
from shoal.launch.states import JobState, TaskState

LAUNCHER_DIED = "the launcher died; its tasks were stopped"
LAUNCHER_DIED_BEFORE_ANY_TASK = "the launcher died before any task started"
_STOPPED_BY = {"local": "by its watchdog", "ssh": "by their hosts' agents", "slurm": "by their nodes' agents"}
_POLL = 0.05
_KILL_WAIT = 5.0


def launcher_alive(job: JobRecord) -> bool:
    """Whether the process that launched `job` still runs."""
    return same_process(job.launcher_pid, job.launcher_started) is not None


def live_tasks(store: JobStore, job: JobRecord, executor: Executor) -> list[ProcessRecord]:
    """The job's task attempts that still run."""
    return [rec for rec in store.processes(job.id) if executor.alive(rec.ref)]


def reconcile(store: JobStore, job: JobRecord, executor: Executor) -> JobRecord:
    """If `job` is recorded as running but its launcher is gone, make sure none of its
    tasks survived the watchdog (kill those that did) and record it KILLED."""
    if job.state.is_terminal or launcher_alive(job):
        return job
    for rec in live_tasks(store, job, executor):
        executor.kill(rec.ref)
    checks = sweep_job(store, job, executor, kill=True) or []
    left = describe_checks(checks, clean=False, killed=True)
    if store.processes(job.id):
        stopped_by = _STOPPED_BY.get(job.executor)
        why = LAUNCHER_DIED + (f" ({stopped_by})" if stopped_by else "")
    else:  # (a job still in a scheduler's queue, say)
        why = LAUNCHER_DIED_BEFORE_ANY_TASK
    _mark_killed(store, job, why + "".join(f"; {line}" for line in left))
    return store.find(job.id)


@dataclass(frozen=True)
class Reconciled:
    """A job as `reconcile_jobs` left it; `unchecked` says, in one line, why a job whose
    launcher is gone is shown as recorded ("" when it was reconciled or needed no check)."""

    job: JobRecord
    unchecked: str = ""


def reconcile_jobs(store: JobStore, jobs: Sequence[JobRecord],
                   executor_for: Callable[[str], Executor]) -> list[Reconciled]:
    """`reconcile` each job, for a listing: one whose executor cannot answer (TaskStateUnknown)
    stays as recorded, with the reason; further jobs of that executor kind are then not asked
    (each ask can take the executor's whole timeout, ~20 s against a hung slurmctld). Blocks
    (bounded: at most one failed ask per executor kind)."""
    failed: dict[str, tuple[str, TaskStateUnknown]] = {}  # executor kind -> (job id, why)
    out = []
    for job in jobs:
        if job.state.is_terminal or launcher_alive(job):
            out.append(Reconciled(job))
        elif job.executor in failed:
            first, error = failed[job.executor]
            out.append(Reconciled(job, f"its launcher is gone, but its tasks were not checked: asking about job"
                                       f" {first} just failed ({error})"))
        else:
            try:
                out.append(Reconciled(reconcile(store, job, executor_for(job.executor))))
            except TaskStateUnknown as e:
                failed[job.executor] = (job.id, e)
                out.append(Reconciled(job, f"its launcher is gone, but {e}"))
            except WorkspaceError as e:  # checked (and cleaned), but the records cannot take it: a full disk
                out.append(Reconciled(job, f"its launcher is gone and its tasks were checked, but the records"
                                           f" could not be updated: {e}"))
    return out


def sweep_job(store: JobStore, job: JobRecord, executor: Executor, kill: bool) -> Optional[list[HostCheck]]:
    """Every host the job ran on, checked for processes of the job (killed when `kill`); None
    if the executor cannot tell (it is not a Sweeper). Blocks (bounded)."""
    sweep = getattr(executor, "sweep", None)
    if sweep is None:
        return None
    return sweep(job.id, [rec.ref for rec in store.processes(job.id)], kill)


def describe_checks(checks: list[HostCheck], *, clean: bool = True, killed: bool = False) -> list[str]:
    """One line per process found ("host2: worker:1 pid 42 still runs: python t.py"; "was left
    running, killed" after a sweep that killed) and per host that could not be checked; a line
    per clean host too when `clean`."""
    lines = []
    for check in checks:
        where = check.host or "this machine"
        if check.error:
            lines.append(f"could not check {check.error}")
        elif not check.found and clean:
            lines.append(f"{where}: no process of the job" + (f" ({check.note})" if check.note else ""))
        for proc in check.found:
            fate = ("survived SIGKILL" if proc in check.survivors
                    else "was left running; killed" if killed else "still runs")
            lines.append(f"{where}: {proc.task or 'a process'} pid {proc.pid} {fate}: {proc.command}")
    return lines


def kill_job(store: JobStore, job: JobRecord, executor: Executor,
             timeout: float = 20.0) -> JobRecord:
    """Stop `job` and everything it started; idempotent. A running job is asked to stop
    through its launcher (SIGTERM: TERM, grace, KILL of each task), and whatever still
    runs after `timeout` seconds is SIGKILLed with its process group. Blocks.

    TaskStateUnknown if the executor cannot say whether the tasks still run (a hung
    slurmctld): the launcher is gone by then (it stopped, or was SIGKILLed; its watchdog ends
    what it started), so the job is recorded KILLED all the same, but nothing was verified."""
    if not job.state.is_terminal:
        launcher = same_process(job.launcher_pid, job.launcher_started)
        if launcher is not None:
            mark_kill_requested(job.job_dir)  # so the launcher's end reason names shoal kill
            try:
                launcher.send_signal(signal.SIGTERM)
            except psutil.Error:
                withdraw_kill_request(job.job_dir)
            if not _wait_stopped(store, job.id, launcher, timeout):
                try:
                    launcher.kill()
                except psutil.Error:
                    pass
    try:
        for rec in live_tasks(store, job, executor):
            executor.kill(rec.ref)
        deadline = time.monotonic() + _KILL_WAIT
        while live_tasks(store, job, executor) and time.monotonic() < deadline:
            time.sleep(_POLL)
    except TaskStateUnknown:
        _record_killed(store, job.id)
        raise
    return _record_killed(store, job.id)


def _wait_stopped(store: JobStore, job_id: str, launcher: psutil.Process,
                  timeout: float) -> bool:
    """Wait until the job is recorded as over or its launcher is gone (a zombie counts:
    the launcher may not be our child, so we cannot reap it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.find(job_id).state.is_terminal:
            return True
        try:
            if launcher.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        time.sleep(_POLL)
    return False


def _record_killed(store: JobStore, job_id: str) -> JobRecord:
    """The job as recorded, marked KILLED by shoal kill first if it is not over."""
    job = store.find(job_id)
    if job.state.is_terminal:
        return job
    _mark_killed(store, job, "killed by shoal kill")
    return store.find(job_id)


def _mark_killed(store: JobStore, job: JobRecord, reason: str) -> None:
    for task in job.tasks:
        if not task.state.is_terminal:
            store.set_task(job.id, task.name, TaskState.KILLED, reason, task.restarts)
    store.set_job_state(job.id, JobState.KILLED, reason, ended=True)
