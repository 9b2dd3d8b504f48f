"""The host agent's one-shot report on a job's processes on one host, as every remote executor
reads it: `python -m shoal.launch.agent --find JOB_ID [--task T] [--kill] [--usage S] [--has PATH]`
(run over ssh by ssh_control.py, as a Slurm step by executor_slurm.py) prints one JSON line,
which becomes a `HostScan`; `task_usage` reads one task attempt's CPU, memory and GPU use from it.

The report comes from another machine: it is JSON (never unpickled), validated field by field,
and a damaged one is a `HostScan` with an `error`, not an exception. Pure: no I/O; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from shoal.launch.executor import HostCheck, Leftover, TaskRef, Usage
from shoal.launch.job_processes import JobProcess

MAX_REPORT = 8 << 20
"""The most of a host's output that is read for the report."""

START_TIME_SLACK_S = 0.05
"""How far two create times of one process may differ (psutil rounds them)."""


@dataclass(frozen=True)
class HostScan:
    """What one host said: the job's processes there (with CPU and RSS when measured), those
    that survived a kill, its memory and GPU use (pid, %, bytes), whether the path asked about
    exists there (`has`); or `error`, one line."""

    host: str
    processes: tuple[JobProcess, ...] = ()
    survivors: tuple[JobProcess, ...] = ()
    mem_total: int = 0
    gpus: Optional[tuple[tuple[int, float, int], ...]] = None
    has: Optional[bool] = None
    error: str = ""
    agent_killed: bool = False
    """A lost agent the scan was asked to kill was there, and was killed."""


def find_args(job_id: str, *, task: Optional[str] = None, kill: bool = False, usage: Optional[float] = None,
              has: Optional[str] = None, kill_agent: Optional[tuple[int, float]] = None) -> list[str]:
    """The agent's arguments that ask for the report on job `job_id` (see the module docstring);
    `kill_agent` (pid, create time): also SIGKILL that lost agent."""
    return ["--find", job_id] + (["--task", task] if task else []) + (["--kill"] if kill else []) + \
        (["--usage", f"{usage:g}"] if usage is not None else []) + (["--has", has] if has else []) + \
        (["--kill-agent", f"{kill_agent[0]}@{kill_agent[1]!r}"] if kill_agent else [])


def read_report(host: str, stdout: bytes) -> Optional[HostScan]:
    """The report in what the agent's command printed on `host` (its last JSON line: a login
    banner may come first); None if there is none, a HostScan with `error` if it is damaged."""
    for line in reversed(stdout[:MAX_REPORT].splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("processes"), list):
            return _host_scan(host, data)
    return None


def is_member(proc: JobProcess, ref: TaskRef) -> bool:
    """Whether `proc` belongs to the attempt `ref`: it is the task itself (same pid and create
    time) or in its process group (the job's processes only, so a reused group id cannot fool)."""
    if proc.pid == ref.pid:
        return ref.started is not None and abs(proc.started - ref.started) <= START_TIME_SLACK_S
    return proc.pgid == ref.pid


def task_usage(scan: HostScan, ref: TaskRef) -> Optional[Usage]:
    """The use of the attempt `ref` (its process and its group together) in a report measured
    with `--usage`; None when the host could not say or the attempt no longer runs there."""
    if scan.error:
        return None
    procs = [p for p in scan.processes if is_member(p, ref)]
    if not any(p.pid == ref.pid for p in procs):
        return None
    pids = {p.pid for p in procs}
    gpu_pct = gpu_mem = None
    if scan.gpus is not None:
        used = [(pct, mem) for pid, pct, mem in scan.gpus if pid in pids]
        gpu_pct = max((pct for pct, _ in used), default=0.0)
        gpu_mem = sum(mem for _, mem in used)
    return Usage(sum(p.cpu or 0.0 for p in procs), sum(p.rss or 0 for p in procs), scan.mem_total, gpu_pct, gpu_mem)


def _host_scan(host: str, report: dict[str, Any]) -> HostScan:
    try:
        gpus = report.get("gpus")
        return HostScan(
            host,
            processes=_processes(report["processes"]),
            survivors=_processes(report.get("survivors") or ()),
            mem_total=int(report.get("mem_total") or 0),
            gpus=None if gpus is None else tuple((int(pid), float(pct), int(mem)) for pid, pct, mem in gpus),
            has=None if report.get("has") is None else bool(report["has"]),
            agent_killed=report.get("agent_killed") is True,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return HostScan(host, error=f"{host}: the agent's report is damaged ({e}); is the same Shoal installed there?")


def _processes(items: Sequence[Any]) -> tuple[JobProcess, ...]:
    return tuple(JobProcess.from_json(p) for p in items)


def host_check(found: HostScan) -> HostCheck:
    """A host's scan as the HostCheck a sweep reports: its leftovers, survivors, error."""
    return HostCheck(found.host, tuple(_leftover(p) for p in found.processes),
                     tuple(_leftover(p) for p in found.survivors), found.error)


def _leftover(proc: JobProcess) -> Leftover:
    return Leftover(proc.pid, proc.task, proc.command)
