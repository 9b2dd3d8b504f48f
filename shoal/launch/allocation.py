"""`Allocation`: where each task of a job runs — host, port, GPUs — and which interpreter
runs `python` commands. The part of planning that depends on the executor.

Each executor provides `allocate(spec) -> Allocation` (the local one picks free ports on
127.0.0.1 and counts this host's GPUs); `plan.make_plan` then renders argv, TF_CONFIG and
the environment from it without any I/O. Pure data and pure helpers here; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shoal.cluster import TaskId
from shoal.launch.errors import PlanError
from shoal.launch.spec import JobSpec
from shoal.launch.visible_gpus import VisibleGpus

ROLE_ORDER = ("ps", "chief", "worker", "evaluator")
"""The order tasks are planned and started in."""


@dataclass(frozen=True)
class TaskAllocation:
    """Where one task runs. `host` is the address it listens on (as TF_CONFIG lists it);
    `node` the machine as the executor names it (an ssh destination, a Slurm node; "" for
    this machine). `gpus` are the GPUs it gets on its host, as CUDA_VISIBLE_DEVICES names them
    (visible_gpus.py); `gpu_host` says whether that host has GPUs at all (then a task without
    any is kept off them with CUDA_VISIBLE_DEVICES="")."""

    task: TaskId
    host: str
    port: int
    gpus: tuple[str, ...] = ()
    gpu_host: bool = False
    node: str = ""

    @property
    def address(self) -> str:
        """"host:port", as TF_CONFIG lists it ("[::1]:port" for an IPv6 host)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Allocation:
    """A whole job's placement: its tasks in start order (ps, chief, worker, evaluator),
    the rendezvous address for PyTorch-style programs, the Python that runs a command
    starting with `python`, and the variables the executor passes on to every task (an
    ssh executor: the launcher's PYTHONPATH ...; the spec's env: comes after them)."""

    tasks: tuple[TaskAllocation, ...]
    master_host: str
    master_port: int
    python: str
    env: tuple[tuple[str, str], ...] = ()


def task_ids(spec: JobSpec) -> list[TaskId]:
    """Every task of `spec`, in start order."""
    return [TaskId(job, i) for job in ROLE_ORDER for i in range(spec.count(job))]


def assign_gpus(spec: JobSpec, ids: list[TaskId], gpus: VisibleGpus) -> dict[TaskId, tuple[str, ...]]:
    """Distinct GPUs of one host (of `gpus`, in order) for the tasks that ask for them, in task
    order; PlanError if the host has none or too few."""
    wanted = sum(spec.role(t.job).gpus for t in ids)
    if wanted and not gpus.ids:
        roles = sorted({t.job for t in ids if spec.role(t.job).gpus})
        if gpus.limited_by:
            raise PlanError(
                f"roles {', '.join(roles)} ask for {wanted} GPU(s) in all, but {gpus.limited_by} leaves"
                " no GPU to the job; name the GPUs it may use there (or unset it), or set gpus: 0"
            )
        raise PlanError(
            f"roles {', '.join(roles)} ask for {wanted} GPU(s) in all, but no NVIDIA GPU was"
            " found on this host (nvidia-ml-py missing or reports none); set gpus: 0, or"
            " pip install nvidia-ml-py on a machine with GPUs"
        )
    if wanted > len(gpus):
        limit = f" ({gpus.limited_by})" if gpus.limited_by else ""
        raise PlanError(
            f"the job asks for {wanted} GPUs in all but this host has {len(gpus)}{limit};"
            " lower roles.<role>.gpus or the counts"
        )
    out, next_gpu = {}, 0
    for task in ids:
        n = spec.role(task.job).gpus
        out[task] = gpus.ids[next_gpu:next_gpu + n]
        next_gpu += n
    return out


def refuse_gpu_roles_that_cannot_grow(spec: JobSpec, gpus: VisibleGpus) -> None:
    """PlanError for a role that starts with no task (`count: 0..N`) but asks for more GPUs per
    task than `gpus` (the job's only host: the local executor) has: every `shoal scale` of it
    would be refused, so the job is, before anything starts."""
    for job, role in sorted(spec.roles.items()):
        if not role.gpus or role.count or not role.max_count or role.gpus <= len(gpus):
            continue
        if not gpus.ids:
            why = (f"{gpus.limited_by} leaves no GPU to the job" if gpus.limited_by else
                   "no NVIDIA GPU was found on this host (nvidia-ml-py missing or reports none)")
        else:
            limit = f" ({gpus.limited_by})" if gpus.limited_by else ""
            why = f"this host has {len(gpus)} GPU(s){limit}"
        raise PlanError(f"roles.{job} (count: 0..{role.max_count}, gpus: {role.gpus}) starts with no task, and every"
                        f" `shoal scale` of it would be refused: {why}; lower its gpus (0 for none), or start the"
                        " job on a machine with enough GPUs")


FREE_GPUS_HINT = ("scale a role with GPUs down first (a task being stopped keeps its GPUs until it exits,"
                  " within grace_period), or start the job again with a lower roles.<role>.gpus")
"""What a refusal for too few free GPUs says to do."""


def free_gpus(gpus: VisibleGpus, held: Iterable[str]) -> tuple[str, ...]:
    """The GPUs of `gpus` (in order) that are not in `held`."""
    busy = set(held)
    return tuple(g for g in gpus.ids if g not in busy)


def take_free_gpus(want: int, gpus: VisibleGpus, held: Iterable[str], task: TaskId,
                   where: str = "this host") -> tuple[str, ...]:
    """`want` GPUs of `gpus` (in order) that no task holds now (`held`: the GPUs of the
    tasks that run there), for `task`, added to a running job or moved; PlanError saying how
    many are free when too few are."""
    if not want:
        return ()
    if not gpus.ids:
        why = (f"{gpus.limited_by} leaves it none" if gpus.limited_by
               else "no NVIDIA GPU was found: nvidia-ml-py missing or reports none")
        raise PlanError(f"{task} asks for {want} GPU(s) but {where} has no GPU for the job ({why}); start"
                        " the job again where it has GPUs, or with gpus: 0 for the role")
    free = free_gpus(gpus, held)
    if len(free) < want:
        limit = f", {gpus.limited_by}" if gpus.limited_by else ""
        raise PlanError(f"{task} asks for {want} GPU(s) but {where} has {len(free)} free of {len(gpus)}"
                        f" ({len(gpus) - len(free)} held by the job's tasks{limit}); {FREE_GPUS_HINT}")
    return free[:want]
