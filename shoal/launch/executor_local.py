"""`LocalExecutor`: runs a job's tasks as processes of this machine, on 127.0.0.1.

It owns the process mechanics: each task leads its own process group and gets the
kernel's parent-death signal (local_process.py); a watchdog process per job (reaper.py,
driven by local_reaper.py) kills every group if the launcher dies, grandchildren included
— the parent-death signal alone reaches only the direct child. `allocate` picks free
ports and the GPUs tasks may use (visible_gpus.py). The control calls (`alive`, `kill`,
`sample`) work from any process, given the records' TaskRefs, through psutil.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Optional

import psutil

from shoal.cluster import TaskId
from shoal.launch.allocation import (Allocation, TaskAllocation, assign_gpus, refuse_gpu_roles_that_cannot_grow,
                                     take_free_gpus, task_ids)
from shoal.launch import job_processes
from shoal.launch.errors import PlanError
from shoal.launch.executor import HostCheck, Leftover, TaskRef, Usage
from shoal.launch.hosts import refuse_pins_off_this_machine
from shoal.launch.local_process import LocalProcess
from shoal.launch.local_reaper import Reaper
from shoal.launch.nvml import gpu_usage
from shoal.launch.plan import JobPlan, TaskPlan
from shoal.launch.ports import free_ports
from shoal.launch.processes import process_started, same_process
from shoal.launch.spec import JobSpec
from shoal.launch.visible_gpus import VisibleGpus, unchecked_notice, visible_gpus

KIND = "local"
_CHUNK = 1 << 16
_MAX_REAPER_GRACE = 3.0
_CLOSE_WAIT = 5.0
"""How long `close` waits for a SIGKILLed task (one stuck in the kernel may never go; the
reaper still signals its group when the executor closes)."""


class LocalHandle:
    """One attempt of one task started by LocalExecutor (see executor.TaskHandle)."""

    def __init__(self, proc: LocalProcess, ref: TaskRef, *, grace: float,
                 reaper: Reaper) -> None:
        self._proc = proc
        self._ref = ref
        self._grace = grace
        self._reaper = reaper
        self._lock = threading.Lock()
        self._code: Optional[int] = None

    @property
    def ref(self) -> TaskRef:
        return self._ref

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return None
        try:
            if self._code is None:
                code = self._proc.wait_exit(timeout)
                if code is None:
                    return None
                self._proc.stop_group(self._grace)
                self._reaper.remove(self._proc.pgid)  # before reaping: then the pgid is free
                self._proc.reap()
                self._code = code
            return self._code
        finally:
            self._lock.release()

    def signal(self, sig: int) -> None:
        self._proc.signal_group(sig)

    def output(self) -> Iterator[bytes]:
        pipe = self._proc.stdout
        try:
            while True:
                try:
                    chunk = os.read(pipe.fileno(), _CHUNK)
                except OSError:
                    return
                if not chunk:
                    return
                yield chunk
        finally:
            pipe.close()

    def close(self) -> None:
        if self._code is None:
            self._proc.signal_group(signal.SIGKILL)
        self.wait(_CLOSE_WAIT)


class LocalExecutor:
    """Tasks as local processes (see the module docstring). `python` runs commands that
    start with `python`; `base_env` is the environment tasks inherit (the launcher's);
    `gpu_count` None means "when a role wants GPUs, the launcher's CUDA_VISIBLE_DEVICES, else
    nvidia-ml-py's count" (visible_gpus.py).

    `start` must be called from one thread that outlives the job; `close` from any, once
    that thread is done starting tasks. The constructor does no I/O.
    """

    kind = KIND

    def __init__(self, *, python: str = sys.executable,
                 base_env: Optional[Mapping[str, str]] = None,
                 gpu_count: Optional[int] = None, host: str = "127.0.0.1",
                 notify: Callable[[str], None] = lambda text: None) -> None:
        self._python = python
        self._notify = notify
        self._job_id: Optional[str] = None
        self._base_env = dict(base_env or {})
        self._gpu_count = gpu_count
        self._visible = VisibleGpus()  # what `allocate` found
        self._host = host
        self._reaper: Optional[Reaper] = None
        self._handles: list[LocalHandle] = []
        self._lock = threading.Lock()
        self._closed = False

    # --- running a job --------------------------------------------------------------

    def allocate(self, spec: JobSpec) -> Allocation:
        refuse_pins_off_this_machine(spec.pinned_hosts())
        ids = task_ids(spec)
        ports = free_ports(len(ids) + 1, self._host)
        visible = self._visible = self._visible_gpus(spec)
        if visible.unchecked:
            self._notify(unchecked_notice(visible, "this host"))
        refuse_gpu_roles_that_cannot_grow(spec, visible)
        gpus = assign_gpus(spec, ids, visible)
        return Allocation(
            tasks=tuple(TaskAllocation(task, self._host, port, gpus[task], gpu_host=len(visible) > 0)
                        for task, port in zip(ids, ports[:-1], strict=True)),
            master_host=self._host, master_port=ports[-1], python=self._python,
        )

    def _visible_gpus(self, spec: JobSpec) -> VisibleGpus:
        """The GPUs tasks may get: `gpu_count`'s when given, else (when a role wants some, one
        that starts with no task too) the launcher's CUDA_VISIBLE_DEVICES or nvidia-ml-py's count."""
        if self._gpu_count is not None:
            return VisibleGpus(tuple(str(i) for i in range(self._gpu_count)))
        if not spec.uses_gpus():
            return VisibleGpus()
        return visible_gpus(self._base_env)

    def place_task(self, job: JobPlan, task: TaskId, running: Sequence[TaskPlan],
                   avoid: Collection[str] = ()) -> TaskAllocation:
        """A task added to the running job (`shoal scale`): a free port of this host and, when
        its role asks for GPUs, ones no running task holds (see executor.TaskPlacer). This host
        is the only one: PlanError if `avoid` names it (""), or too few GPUs are free."""
        if "" in avoid:
            raise PlanError(f"{task} has no other host to run on: the local executor runs every task on this machine")
        template = job.template(task.job)
        gpus = take_free_gpus(template.gpus if template else 0, self._visible, (g for t in running for g in t.gpus),
                              task)
        port = free_ports(1, self._host)[0]
        return TaskAllocation(task, self._host, port, gpus, gpu_host=len(self._visible) > 0)

    def start(self, job: JobPlan, task: TaskPlan) -> LocalHandle:
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalExecutor.start after close")
            self._job_id = job.job_id
            if self._reaper is None:
                self._reaper = Reaper(grace=min(job.grace_period, _MAX_REAPER_GRACE))
                self._reaper.start()
            reaper = self._reaper
        proc = LocalProcess(task, workdir=job.workdir, base_env=self._base_env)
        proc.start()
        reaper.add(proc.pgid)
        # Read now, while the unreaped child's pid cannot name another process.
        ref = TaskRef(KIND, pid=proc.pid, started=process_started(proc.pid))
        handle = LocalHandle(proc, ref, grace=job.grace_period, reaper=reaper)
        with self._lock:
            self._handles.append(handle)
        return handle

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles, self._handles = self._handles, []
            reaper, self._reaper = self._reaper, None
        for handle in handles:
            handle.close()
        if reaper is not None:
            reaper.close()
        if self._job_id is not None:
            self._sweep_after(self._job_id)

    def _sweep_after(self, job_id: str) -> None:
        """The job is over and its process groups are gone: kill any process of it left on this
        machine (one that left its group: `setsid`, a daemon) and say which. Blocks (bounded)."""
        for check in self.sweep(job_id, (), kill=True):
            for proc in check.found:
                fate = "survived SIGKILL" if proc in check.survivors else "killed"
                self._notify(f"shoal | this machine: {proc.task or 'a process'} pid {proc.pid} ({proc.command}) of"
                             f" job {job_id} still ran after the job, outside its task's process group; {fate}")

    # --- control of recorded tasks (any process) ------------------------------------

    def alive(self, ref: TaskRef) -> bool:
        return same_process(ref.pid, ref.started) is not None

    def kill(self, ref: TaskRef) -> None:
        proc = same_process(ref.pid, ref.started)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def sweep(self, job_id: str, refs: Sequence[TaskRef], kill: bool) -> list[HostCheck]:
        """This machine checked for processes of `job_id` (see executor.Sweeper)."""
        if kill:
            found, left = job_processes.kill(job_id)
        else:
            found, left = job_processes.find(job_id), []
        return [HostCheck("", tuple(_leftover(p) for p in found), tuple(_leftover(p) for p in left))]

    def sample(self, refs: Mapping[str, TaskRef], interval: float) -> dict[str, Usage]:
        total = psutil.virtual_memory().total
        trees: dict[str, list[psutil.Process]] = {}
        for name, ref in refs.items():
            leader = same_process(ref.pid, ref.started)
            if leader is None:
                continue
            try:
                trees[name] = [leader, *leader.children(recursive=True)]
            except psutil.Error:
                continue
        for procs in trees.values():
            for proc in procs:
                _cpu(proc)
        time.sleep(interval)
        gpus = gpu_usage()
        out = {}
        for name, procs in trees.items():
            pids = {p.pid for p in procs}
            gpu_pct = gpu_mem = None
            if gpus is not None:
                used = [(pct, mem) for pid, pct, mem in gpus if pid in pids]
                gpu_pct = max((pct for pct, _ in used), default=0.0)
                gpu_mem = sum(mem for _, mem in used)
            out[name] = Usage(sum(_cpu(p) for p in procs), sum(_rss(p) for p in procs),
                              total, gpu_pct, gpu_mem)
        return out


def _leftover(proc: job_processes.JobProcess) -> Leftover:
    return Leftover(proc.pid, proc.task, proc.command)


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
