"""Resource samples of a job's tasks for `shoal monitor`: CPU %, memory, and GPU use
when nvidia-ml-py finds GPUs. Each task counts its whole process tree.

`sample_job` blocks for `interval` seconds (CPU % needs two readings); thread-safe.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import psutil

from shoal.launch.control import live_processes
from shoal.launch.records import JobRecord, JobStore


@dataclass(frozen=True)
class TaskSample:
    """One task's use of the machine; None where unknown (not running, no GPU)."""

    name: str
    state: str
    pid: Optional[int]
    cpu_percent: Optional[float]
    mem_percent: Optional[float]
    mem_used: Optional[int]
    mem_total: int
    gpu_percent: Optional[float] = None
    gpu_mem_used: Optional[int] = None


def sample_job(store: JobStore, job: JobRecord, interval: float = 0.5) -> list[TaskSample]:
    """Measure every task of `job` over `interval` seconds."""
    total = psutil.virtual_memory().total
    leaders = {p.pid: p for p in live_processes(store, job)}
    trees: dict[str, list[psutil.Process]] = {}
    for task in job.tasks:
        leader = leaders.get(task.pid or -1)
        if leader is None:
            continue
        try:
            trees[task.name] = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            continue
    for procs in trees.values():
        for proc in procs:
            _cpu(proc)
    time.sleep(interval)
    gpus = _gpu_usage()
    out = []
    for task in job.tasks:
        procs = trees.get(task.name)
        if procs is None:
            out.append(TaskSample(task.name, task.state, task.pid, None, None, None, total))
            continue
        cpu = sum(_cpu(p) for p in procs)
        rss = sum(_rss(p) for p in procs)
        pids = {p.pid for p in procs}
        gpu_pct = gpu_mem = None
        if gpus is not None:
            used = [(pct, mem) for pid, pct, mem in gpus if pid in pids]
            gpu_pct = max((pct for pct, _ in used), default=0.0)
            gpu_mem = sum(mem for _, mem in used)
        out.append(TaskSample(task.name, task.state, task.pid, cpu, 100.0 * rss / total, rss,
                              total, gpu_pct, gpu_mem))
    return out


def _cpu(proc: psutil.Process) -> float:
    try:
        return proc.cpu_percent(None)
    except psutil.Error:
        return 0.0


def _rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def _gpu_usage() -> Optional[list[tuple[int, float, int]]]:
    """(pid, device utilization %, GPU memory bytes) per GPU process; None without NVML."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out.append((proc.pid, util, int(proc.usedGpuMemory or 0)))
        return out
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def gpu_count() -> int:
    """How many NVIDIA GPUs this host has (0 without nvidia-ml-py or a driver)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
    finally:
        pynvml.nvmlShutdown()
