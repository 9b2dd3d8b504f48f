"""Every process of one job on this host, found by the `SHOAL_JOB_ID=<id>` every task has in
its environment (and every process it starts inherits): list them, measure them, kill them.

This finds what a job left behind whatever became of its groups: a grandchild that called
`setsid`, a task whose agent was SIGKILLed. The host agent's one-shot mode (`python -m
shoal.launch.agent --find JOB_ID [--kill] [--usage S]`) runs it on a remote host; the local
executor calls it directly. Reading another user's /proc/PID/environ needs root, so a job is
found among the processes of the user running this (or of everyone, as root).

"This host" is this process's network namespace: a task inherits its agent's, so processes in
another namespace (a container, or a test host that shares this machine's process table) are
another host's and are neither listed nor killed from here.

Standard library and psutil only (the agent imports it). Thread-safe; `find` reads the process
table once (tens of milliseconds); `kill` and `measure` block for their bounded waits.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

import psutil

from shoal.launch.processes import same_process

JOB_VARIABLE = "SHOAL_JOB_ID"
TASK_VARIABLE = "SHOAL_TASK"
_COMMAND_CHARS = 200


@dataclass(frozen=True)
class JobProcess:
    """One live process of a job: its pid, group, create time, the task it belongs to
    ("worker:1", from SHOAL_TASK) and its command line (cut to 200 characters); `cpu` (%) and
    `rss` (bytes) when measured."""

    pid: int
    pgid: int
    started: float
    task: str
    command: str
    cpu: Optional[float] = None
    rss: Optional[int] = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "JobProcess":
        """The process `as_json` described; ValueError/TypeError/KeyError if it is not one."""
        return cls(pid=int(data["pid"]), pgid=int(data["pgid"]), started=float(data["started"]),
                   task=str(data.get("task") or ""), command=str(data.get("command") or ""),
                   cpu=None if data.get("cpu") is None else float(data["cpu"]),
                   rss=None if data.get("rss") is None else int(data["rss"]))


def find(job_id: str, task: Optional[str] = None) -> list[JobProcess]:
    """The live (non-zombie) processes of this host whose environment holds SHOAL_JOB_ID=job_id
    (and SHOAL_TASK=task, when given), by pid."""
    if not job_id:
        return []
    me = os.getpid()
    here = _network_namespace(me)
    out = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if _network_namespace(proc.pid) != here:
                continue
            environ = proc.environ()
            if environ.get(JOB_VARIABLE) != job_id or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if task is not None and environ.get(TASK_VARIABLE) != task:
                continue
            out.append(JobProcess(proc.pid, os.getpgid(proc.pid), proc.create_time(),
                                  environ.get(TASK_VARIABLE, ""),
                                  " ".join(proc.cmdline())[:_COMMAND_CHARS]))
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return sorted(out, key=lambda p: p.pid)


def kill(job_id: str, task: Optional[str] = None,
         wait: float = 5.0) -> tuple[list[JobProcess], list[JobProcess]]:
    """SIGKILL every process of the job (of its task `task`, when given) on this host, their
    groups too; returns (what was found, what still ran `wait` seconds later). Blocks up to
    `wait` seconds."""
    found = find(job_id, task)
    leaders = {proc.pid for proc in found}
    for proc in found:
        # Its group too, when a process of the job leads it (never a group of someone else's).
        targets = [(os.killpg, proc.pgid)] if proc.pgid in leaders else []
        for send, target in [*targets, (os.kill, proc.pid)]:
            try:
                send(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + wait
    left = _still_running(found)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _still_running(left)
    return found, left


def measure(processes: list[JobProcess], interval: float) -> list[JobProcess]:
    """`processes` with their CPU % over `interval` seconds and their RSS; those gone meanwhile
    are left out. Blocks for `interval` (at most 5 s)."""
    live = []
    for proc in processes:
        handle = same_process(proc.pid, proc.started)
        if handle is None:
            continue
        try:
            handle.cpu_percent(None)
            live.append((proc, handle))
        except psutil.Error:
            continue
    time.sleep(min(max(interval, 0.05), 5.0))
    out = []
    for proc, handle in live:
        try:
            out.append(JobProcess(proc.pid, proc.pgid, proc.started, proc.task, proc.command,
                                  handle.cpu_percent(None), handle.memory_info().rss))
        except psutil.Error:
            continue
    return out


def _network_namespace(pid: int) -> Optional[str]:
    """Which network namespace `pid` is in ("net:[4026531840]"); None where /proc does not say."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _still_running(processes: list[JobProcess]) -> list[JobProcess]:
    return [proc for proc in processes if same_process(proc.pid, proc.started) is not None]
