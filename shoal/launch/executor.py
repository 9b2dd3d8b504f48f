"""The executor seam: where and how tasks run, behind one interface, as TorchX's
`Scheduler` is. The supervisor (policy) talks only to this; each executor is one module
(`executor_local.py`; ssh and Slurm ones slot in beside it).

An `Executor` does two things:

* run one job: `allocate(spec)` places the tasks (hosts, ports, GPUs, interpreter; the
  executor may hold what it reserved until `close`), `start(job, task)` starts one attempt
  of one task and returns its `TaskHandle`, `close()` ends whatever the executor still holds
  for the job (idempotent; it kills tasks still running).
* control recorded tasks from any process (`shoal kill`, `status`, `monitor`), given only
  the `TaskRef` the job records store: `alive`, `kill`, `sample`. The records name the
  executor kind of every job, so these calls go to the executor that started it.

An executor that can also find *every* process of a job on its hosts, whatever became of
their process groups (by the SHOAL_JOB_ID in their environment), is a `Sweeper`: `shoal check`
and the clean-up of a job whose launcher died use it to confirm that nothing is left.

This module is pure data and protocols: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol, runtime_checkable

from shoal.launch.errors import LaunchError

if TYPE_CHECKING:
    from shoal.cluster import TaskId
    from shoal.launch.allocation import Allocation, TaskAllocation
    from shoal.launch.plan import JobPlan, TaskPlan
    from shoal.launch.spec import JobSpec


@dataclass(frozen=True)
class TaskRef:
    """Where one attempt of one task runs, as the job records keep it instead of a pid.

    `executor` is the kind that started it ("local"); `pid` the task's main process on
    `host` ("" for this machine) and `started` its create time, so that a later process
    reusing the pid is never taken for it; `extra` holds what else an executor needs to
    find the task again (a Slurm job and step id, an agent's address), as (key, value)
    strings sorted by key.
    """

    executor: str
    pid: Optional[int] = None
    started: Optional[float] = None
    host: str = ""
    extra: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """"pid 4242", "pid 4242 on node3": how logs and `shoal status` name the task."""
        where = f"pid {self.pid}" if self.pid is not None else self.executor
        return f"{where} on {self.host}" if self.host else where

    def to_json(self) -> str:
        """The reference as one line of JSON (how the records store it)."""
        return json.dumps({"executor": self.executor, "pid": self.pid,
                           "started": self.started, "host": self.host,
                           "extra": dict(self.extra)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TaskRef":
        """Parse `to_json`'s output; LaunchError if it is not one."""
        try:
            data = json.loads(text)
            return cls(
                executor=str(data["executor"]),
                pid=None if data.get("pid") is None else int(data["pid"]),
                started=None if data.get("started") is None else float(data["started"]),
                host=str(data.get("host") or ""),
                extra=tuple(sorted((str(k), str(v)) for k, v in
                                   (data.get("extra") or {}).items())),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise LaunchError(
                f"a task reference in the job records is damaged ({text!r}); the job's"
                " tasks cannot be found from it (stop them by hand if they still run)"
            ) from e


@dataclass(frozen=True)
class Usage:
    """One task's use of its host, its whole process tree counted."""

    cpu_percent: float
    mem_used: int
    mem_total: int
    gpu_percent: Optional[float] = None
    gpu_mem_used: Optional[int] = None

    @property
    def mem_percent(self) -> float:
        return 100.0 * self.mem_used / self.mem_total if self.mem_total else 0.0


@dataclass(frozen=True)
class Leftover:
    """A process of a job found on a host after it should have ended: its pid, the task it
    belongs to ("worker:1") and its command line."""

    pid: int
    task: str
    command: str


@dataclass(frozen=True)
class HostCheck:
    """What a sweep found on one host ("" for this machine): the job's processes still there
    (killed if the sweep was asked to kill), those that survived even SIGKILL, or `error`:
    why the host could not be checked."""

    host: str
    found: tuple[Leftover, ...] = ()
    survivors: tuple[Leftover, ...] = ()
    error: str = ""
    note: str = ""
    """Said of a clean host whose processes were not looked at but are known to be gone
    (a Slurm job that is over)."""

    @property
    def clean(self) -> bool:
        return not self.found and not self.error


class Sweeper(Protocol):
    """An executor that can find every process of a job on the hosts it ran on."""

    def sweep(self, job_id: str, refs: Sequence[TaskRef], kill: bool) -> list[HostCheck]:
        """Each host of `refs` (the job's task attempts) checked for processes of `job_id`
        (found by SHOAL_JOB_ID in their environment, so also those that left their group);
        SIGKILLed when `kill`. Blocks (bounded)."""
        ...


class TaskHandle(Protocol):
    """One running attempt of one task, as `Executor.start` returns it.

    `wait` and `output` block and are meant for one thread each; `signal` and `close` are
    thread-safe. After the task exited, `signal` does nothing.
    """

    @property
    def ref(self) -> TaskRef:
        """The serializable reference the records store."""
        ...

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block until the task's main process exited and whatever it left in its group
        was stopped, or `timeout` seconds passed; the exit code (-N: killed by signal N),
        None on timeout. Once it has returned a code it returns the same at once."""
        ...

    def signal(self, sig: int) -> None:
        """Send `sig` to the task's whole process group, if it still runs."""
        ...

    def output(self) -> Iterator[bytes]:
        """The task's stdout and stderr together, as the bytes come (chunks of at most
        64 KiB, yielded as soon as they are read), until the output closes. The consumer
        cuts lines (the LogMux: whole lines, progress bars at "\\r", bounded length), so
        nothing is held back waiting for a newline. Blocks between chunks; one consumer
        only."""
        ...

    def close(self) -> None:
        """Release what the handle holds; kills the task's group first if it still runs.
        Idempotent; blocks until the task is gone (a few seconds at most)."""
        ...


class Executor(Protocol):
    """Runs the tasks of one job somewhere, and controls recorded tasks of its kind.

    `start` must be called from a thread that lives as long as the job (the local
    executor ties its tasks' lives to the thread that started them). Constructors do no
    I/O; `close` is idempotent.
    """

    kind: str
    """The name the job records keep ("local")."""

    def allocate(self, spec: "JobSpec") -> "Allocation":
        """Place every task of `spec`; PlanError if it cannot run here. Blocks briefly."""
        ...

    def start(self, job: "JobPlan", task: "TaskPlan") -> TaskHandle:
        """Start one attempt of `task`; StartError if its program cannot be run. An executor
        whose host for `task` is being reconnected in the background raises StartDeferred (a
        StartError): the caller asks again shortly, and the attempt has not failed."""
        ...

    def close(self) -> None:
        """End what the executor holds for the job; kills tasks still running."""
        ...

    def alive(self, ref: TaskRef) -> bool:
        """Whether the task `ref` names still runs (never fooled by a reused pid).
        TaskStateUnknown if what the executor asks cannot answer (a hung slurmctld)."""
        ...

    def kill(self, ref: TaskRef) -> None:
        """SIGKILL the task's whole process group if it still runs; idempotent.
        TaskStateUnknown as `alive`."""
        ...

    def sample(self, refs: Mapping[str, TaskRef], interval: float) -> dict[str, Usage]:
        """Measure the tasks (by name) that still run over `interval` seconds; blocks."""
        ...


@runtime_checkable
class TaskPlacer(Protocol):
    """An executor that can add a task to a job that runs (`shoal scale`): it places the new
    task — a host of the job and a fresh port there — and then `start` starts it as any other."""

    def place_task(self, job: "JobPlan", task: "TaskId", running: Sequence["TaskPlan"],
                   avoid: Collection[str] = ()) -> "TaskAllocation":
        """Where `task` (a new index, never one that ran) runs; PlanError if it cannot be
        placed. `running` are the job's tasks that hold their place now (running, starting or
        waiting to restart, and scaled-down ones until they have exited: they keep their GPUs
        within grace_period; those that ended are not), so slots and GPUs they left are free
        again. `avoid` names hosts (TaskAllocation.node) not to use: ones that could not start
        it (relocation.py). Called from the thread that starts tasks; blocks briefly."""
        ...


@runtime_checkable
class ExitExplaining(Protocol):
    """A task handle that can say what outside its process ended it: its Slurm job was
    cancelled, requeued or preempted, or ran past its time limit."""

    def exit_cause(self, code: int) -> str:
        """Why the task, which exited with `code` (-N: killed by signal N), ended, in words; ""
        when nothing outside it is known to have ended it. Blocks (bounded: a Slurm query)."""
        ...


@runtime_checkable
class HostLossAware(Protocol):
    """A task handle that knows whether its host was lost (an SSH host that stopped answering)."""

    @property
    def lost_host(self) -> Optional[str]:
        """The host whose loss ended this task; None while it runs, or when it ended otherwise.
        Does not block."""
        ...


@runtime_checkable
class LaunchNotes(Protocol):
    """An executor that does more than start tasks (submits a Slurm job, say) and says what,
    for a dry run to print before the plan."""

    def launch_notes(self) -> str:
        """Lines (each ending in a newline) saying what the executor does besides starting
        the tasks; after `allocate`. No I/O."""
        ...


@runtime_checkable
class Queued(Protocol):
    """An executor whose `allocate` may wait in a scheduler's queue before the job has
    anywhere to run (a Slurm job `--slurm` submitted), so the job is recorded while it waits."""

    def watch_queue(self, listener: "Callable[[str], None]") -> bool:
        """Before `allocate`: have `listener(text)` told each new state of that wait, in words
        ("Slurm job 42 is PENDING (Resources)"), on `allocate`'s thread. Returns whether this
        job may wait in a queue at all (False: inside an allocation, nothing is submitted). No I/O."""
        ...
