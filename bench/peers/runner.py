"""Process mechanics: start a JobSpec's tasks on 127.0.0.1, each in its own process group (and
killed by the kernel if the benchmark dies), timestamp every line they print, sample their
memory and CPU, end the job, kill every group. Blocks; not thread-safe.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

from bench import kill_group, spawn
from bench.mnist_throughput import Task
from bench.peers.systems import End, JobSpec

POLL_S = 0.05


@dataclass
class JobRecord:
    """What one run left: its tasks (lines with arrival times, CPU series, RSS peaks), their
    exit codes (None: killed by us), and the machine's busy CPU time series."""

    spec: JobSpec
    tasks: list[Task]
    codes: dict[str, int | None]
    launched: float
    ended: float
    machine_cpu: list[tuple[float, float]] = field(default_factory=list)
    timed_out: bool = False


def sample_usage(tasks: list[Task], machine_cpu: list[tuple[float, float]], stop: threading.Event) -> None:
    """Until `stop`: each task's peak RSS and private memory (its own process: TensorFlow
    forks short-lived helpers whose shared pages would count twice), its CPU seconds so far
    (process, live children and reaped children), and the machine's busy CPU seconds."""
    handles: dict[str, psutil.Process] = {}
    while not stop.is_set():
        busy = psutil.cpu_times()
        machine_cpu.append((time.monotonic(), sum(busy) - busy.idle - getattr(busy, "iowait", 0.0)))
        for task in list(tasks):
            if task.proc.poll() is not None:
                continue
            try:
                proc = handles.setdefault(task.name, psutil.Process(task.proc.pid))
                info = proc.memory_info()
                times = proc.cpu_times()
                cpu = times.user + times.system + times.children_user + times.children_system
                for child in proc.children(recursive=True):
                    try:
                        t = child.cpu_times()
                        cpu += t.user + t.system
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            task.cpu.append((time.monotonic(), cpu))
            task.peak_rss = max(task.peak_rss, info.rss)
            task.peak_private = max(task.peak_private, info.rss - info.shared)
        stop.wait(POLL_S)


def _env(task_env: dict) -> dict:
    # OUTPUT_DIR would turn on Shoal's checkpoints and summaries (examples' --model_dir default);
    # no system here writes any
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")
           and k not in ("TF_CONFIG", "OUTPUT_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(task_env, PYTHONUNBUFFERED="1")
    return env


def _start(python: str, argv: tuple[str, ...], env: dict) -> subprocess.Popen:
    return spawn(list(argv), env, python, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True, bufsize=1, errors="replace")


def run_job(spec: JobSpec, timeout_s: float, grace_s: float = 10.0) -> JobRecord:
    """Start the tasks in order, wait until the EXITS tasks are done (or one failed, or
    `timeout_s`), give MAY_HANG tasks `grace_s` more, then kill every group. Blocks."""
    tasks: list[Task] = []
    stop = threading.Event()
    machine_cpu: list[tuple[float, float]] = []
    sampler = threading.Thread(target=sample_usage, args=(tasks, machine_cpu, stop), daemon=True)
    launched = time.monotonic()
    deadline = launched + timeout_s
    timed_out = False
    try:
        for ts in spec.tasks:
            task = Task(ts.name, _start(ts.python, ts.argv, _env(ts.env)))
            task.reader = threading.Thread(target=task.read, daemon=True)
            task.reader.start()
            tasks.append(task)
            if len(tasks) == 1:
                sampler.start()
        ends = {t.name: ts.end for t, ts in zip(tasks, spec.tasks)}
        exiting = [t for t in tasks if ends[t.name] is End.EXITS]
        while time.monotonic() < deadline:
            codes = [t.proc.poll() for t in exiting]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(POLL_S)
        else:
            timed_out = True
        hang_deadline = min(deadline, time.monotonic() + grace_s)
        for task in tasks:
            if ends[task.name] is not End.SERVES:
                try:
                    task.proc.wait(max(0.0, hang_deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        ended = time.monotonic()
        codes_now = {t.name: t.proc.poll() for t in tasks}
    finally:
        stop.set()
        for task in tasks:
            kill_group(task.proc)
        for task in tasks:
            if task.reader is not None:
                task.reader.join(5)
        if sampler.is_alive():
            sampler.join(5)
    return JobRecord(spec, tasks, codes_now, launched, ended, machine_cpu, timed_out)
