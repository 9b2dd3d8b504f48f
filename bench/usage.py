"""What the benchmarks sample of their tasks: memory and CPU, with one meaning in every report.

    peak RSS      the peak, over samples taken every SAMPLE_PERIOD_S (50 ms), of the sum of the
                  resident set size (psutil `memory_info().rss`) of the task's process and all
                  its live descendants. Pages shared between those processes (a fork before its
                  exec, an mmap'd file) count once per process that maps them.
    peak private  the same peak of the sum of RSS minus shared pages (psutil `rss - shared`:
                  shared = resident file-backed and shared-memory pages), i.e. the memory the
                  task's processes hold for themselves; unlike RSS it does not count a fork's
                  or an mmap'd file's pages twice. Reported beside peak RSS, never instead.
    CPU           user + system seconds of the task's process and its live descendants, plus
                  those of descendants already reaped (psutil `children_user/children_system`),
                  as a series of (time.monotonic(), seconds so far); and the whole machine's
                  busy CPU seconds (all CPU time but idle and iowait), for the others' share.

Peaks are of samples: a spike shorter than the period may be missed. A task's sampling ends
when its process exits.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

SAMPLE_PERIOD_S = 0.05


@dataclass
class Usage:
    """What the sampler saw of one task. Written by the sampler's thread: read it after
    `UsageSampler.close()`."""

    peak_rss: int = 0       # bytes, see "peak RSS" above
    peak_private: int = 0   # bytes, see "peak private" above
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic time, CPU seconds so far)
    samples: int = 0


@dataclass(frozen=True)
class TreeSample:
    """One reading of a process tree."""

    rss: int
    private: int
    cpu_s: float


def sample_tree(proc: psutil.Process) -> TreeSample:
    """Read `proc` and its live descendants once (a descendant that exits meanwhile is left
    out). Raises psutil.NoSuchProcess (or AccessDenied) when `proc` itself cannot be read.
    Blocks for the /proc reads (well under a millisecond per process); thread-safe."""
    info = proc.memory_info()
    times = proc.cpu_times()
    rss, private = info.rss, info.rss - info.shared
    cpu = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            info = child.memory_info()
            times = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        private += info.rss - info.shared
        cpu += times.user + times.system + times.children_user + times.children_system
    return TreeSample(rss, private, cpu)


def machine_busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (not idle, not iowait)."""
    busy = psutil.cpu_times()
    return sum(busy) - busy.idle - getattr(busy, "iowait", 0.0)


def interpolate(series: list[tuple[float, float]], t: float) -> float:
    """A sampled, increasing (time, value) series at time `t`: linear between samples, the
    first or last value outside them, 0.0 if empty."""
    if not series:
        return 0.0
    for (t0, v0), (t1, v1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return series[0][1] if t < series[0][0] else series[-1][1]


class UsageSampler:
    """Samples every watched task (see the module's definitions) and the machine's busy CPU
    every `period_s`, in a daemon thread of its own, from `start()` to `close()`.

    `watch`, `start` and `close` may be called from any thread; `close` is idempotent, blocks
    until the thread has stopped (at most a few seconds), and is safe in `finally`. The
    constructor does no I/O."""

    def __init__(self, period_s: float = SAMPLE_PERIOD_S) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0 seconds, got {period_s}")
        self.period_s = period_s
        self.machine_cpu: list[tuple[float, float]] = []  # (monotonic time, busy CPU seconds)
        self._watched: list[tuple[subprocess.Popen, Usage]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, proc: subprocess.Popen, usage: Usage) -> None:
        """Sample `proc`'s tree into `usage` from the next sample on, until it exits."""
        with self._lock:
            self._watched.append((proc, usage))

    def start(self) -> None:
        """Start sampling. Does not block; a second call does nothing."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="bench-usage", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(5)

    def _run(self) -> None:
        handles: dict[int, psutil.Process] = {}
        while not self._stop.is_set():
            self.machine_cpu.append((time.monotonic(), machine_busy_cpu_s()))
            with self._lock:
                watched = list(self._watched)
            for proc, usage in watched:
                if proc.poll() is not None:  # exited: its pid may soon belong to another process
                    continue
                try:
                    handle = handles.get(proc.pid)
                    if handle is None:
                        handle = handles[proc.pid] = psutil.Process(proc.pid)
                    sample = sample_tree(handle)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                usage.cpu.append((time.monotonic(), sample.cpu_s))
                usage.peak_rss = max(usage.peak_rss, sample.rss)
                usage.peak_private = max(usage.peak_private, sample.private)
                usage.samples += 1
            self._stop.wait(self.period_s)
