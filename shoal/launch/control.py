"""Control of recorded jobs from another process: is the launcher alive, which of the
job's processes still run, `kill_job`, and `reconcile` for jobs whose launcher died.

Uses psutil and the recorded create times so that a reused pid is never signalled.
Blocking where it waits (bounded); thread-safe.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

import psutil

from shoal.launch.records import JobRecord, JobStore
from shoal.launch.states import JobState, TaskState

LAUNCHER_DIED = "the launcher died; its watchdog stopped the tasks"


def _same_process(pid: Optional[int], started: Optional[float]) -> Optional[psutil.Process]:
    if not pid or not started:
        return None  # without a create time we cannot tell it from a reused pid
    try:
        proc = psutil.Process(pid)
        if started and abs(proc.create_time() - started) > 0.05:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def launcher_alive(job: JobRecord) -> bool:
    """Whether the process that launched `job` still runs."""
    return _same_process(job.launcher_pid, job.launcher_started) is not None


def live_processes(store: JobStore, job: JobRecord) -> list[psutil.Process]:
    """The job's task processes (leaders) that still run."""
    out = []
    for rec in store.processes(job.id):
        proc = _same_process(rec.pid, rec.started)
        if proc is not None:
            out.append(proc)
    return out


def reconcile(store: JobStore, job: JobRecord) -> JobRecord:
    """If `job` is recorded as running but its launcher is gone, record it KILLED."""
    if JobState(job.state).is_terminal or launcher_alive(job):
        return job
    _mark_killed(store, job, LAUNCHER_DIED)
    return store.find(job.id)


def kill_job(store: JobStore, ref: str, timeout: float = 20.0) -> JobRecord:
    """Stop job `ref` and everything it started; idempotent. A running job is asked to
    stop through its launcher (SIGTERM: TERM, grace, KILL of each task), and whatever
    still runs after `timeout` seconds is SIGKILLed with its process group. Blocks."""
    job = store.find(ref)
    if not JobState(job.state).is_terminal:
        launcher = _same_process(job.launcher_pid, job.launcher_started)
        if launcher is not None:
            try:
                launcher.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
            if not _wait_stopped(store, job.id, launcher, timeout):
                try:
                    launcher.kill()
                except psutil.Error:
                    pass
    for proc in live_processes(store, job):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5.0
    while live_processes(store, job) and time.monotonic() < deadline:
        time.sleep(0.05)
    job = store.find(job.id)
    if not JobState(job.state).is_terminal:
        _mark_killed(store, job, "killed by shoal kill")
        job = store.find(job.id)
    return job


def _wait_stopped(store: JobStore, job_id: str, launcher: psutil.Process,
                  timeout: float) -> bool:
    """Wait until the job is recorded as over or its launcher is gone (a zombie counts:
    the launcher may not be our child, so we cannot reap it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if JobState(store.find(job_id).state).is_terminal:
            return True
        try:
            if launcher.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        time.sleep(0.05)
    return False


def _mark_killed(store: JobStore, job: JobRecord, reason: str) -> None:
    for task in job.tasks:
        if not TaskState(task.state).is_terminal:
            store.set_task(job.id, task.name, TaskState.KILLED.value, reason, task.restarts)
    store.set_job_state(job.id, JobState.KILLED.value, reason, ended=True)
