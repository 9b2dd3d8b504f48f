"""`make_plan`: turn a JobSpec into a JobPlan — every task's argv, address, environment
and log file — and `format_plan`, which prints it exactly as it would run (`--dry-run`).

A plan is pure data (frozen dataclasses). Making one binds and releases sockets to find
free ports on the host, and reads nothing else: the caller passes the GPU count, the
Python executable and the directories in.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import shlex
import socket
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.launch.errors import PlanError
from shoal.launch.spec import JobSpec, RestartSpec

PYTHON_NAMES = ("python", "python3")
"""A command starting with one of these runs under the launcher's own Python."""


@dataclass(frozen=True)
class TaskPlan:
    """One task as it will run: identity, address, argv, the variables the launcher sets
    (on top of the launcher's own environment) and its log file."""

    task: TaskId
    label: str
    address: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    log_path: str
    gpus: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """"worker.1": the task's name in logs, records and `--task`."""
        return f"{self.task.job}.{self.task.index}"

    @property
    def env_dict(self) -> dict[str, str]:
        """The launcher-set variables as a dict."""
        return dict(self.env)


@dataclass(frozen=True)
class JobPlan:
    """A whole job ready to start: its tasks in start order (ps first) and its policy."""

    job_id: str
    name: str
    job_dir: str
    model_dir: str
    workdir: str
    tasks: tuple[TaskPlan, ...]
    primary: TaskId
    restart: RestartSpec = field(default_factory=RestartSpec)
    deadline: Optional[float] = None
    grace_period: float = 5.0

    def task(self, name: str) -> TaskPlan:
        """The TaskPlan called `name` ("worker.1"); KeyError if none."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(name)


def new_job_id(name: str, now: Optional[_dt.datetime] = None) -> str:
    """A fresh, sortable job id: "<name>-YYYYMMDD-HHMMSS-<4 hex>"."""
    now = now or _dt.datetime.now()
    return f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free on `host` a moment ago (all bound at once,
    then released). Blocks briefly; thread-safe."""
    try:
        with ExitStack() as stack:
            ports = []
            for _ in range(count):
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                sock.bind((host, 0))
                ports.append(sock.getsockname()[1])
            return ports
    except OSError as e:
        raise PlanError(f"cannot find {count} free ports on {host}: {e}") from e


def make_plan(
    spec: JobSpec,
    *,
    job_id: str,
    shoal_home: Path,
    workdir: Path,
    python: str,
    gpu_count: int = 0,
    host: str = "127.0.0.1",
    secret: Optional[str] = None,
) -> JobPlan:
    """Plan `spec` as job `job_id` on `host`; PlanError if it cannot run here.

    `workdir` (absolute) is where shoal was started; a relative spec.workdir or
    output_dir is taken from there. Tasks are ordered ps, chief, worker, evaluator.
    `gpu_count` is how many GPUs the host has; tasks asking for GPUs get distinct ones,
    in task order.
    """
    job_dir = (shoal_home / "jobs" / job_id).resolve()
    workdir = (workdir / spec.workdir if spec.workdir else workdir).resolve()
    if spec.output_dir:
        out = Path(spec.output_dir).expanduser()
        model_dir = out if out.is_absolute() else workdir / out
    else:
        model_dir = job_dir / "model"
    order = ("ps", "chief", "worker", "evaluator")
    ids = [TaskId(job, i) for job in order for i in range(spec.count(job))]
    ports = free_ports(len(ids) + 1, host)
    addresses = {task: f"{host}:{port}" for task, port in zip(ids, ports[:-1], strict=True)}
    cluster = ClusterSpec.from_dict(
        {job: [addresses[t] for t in ids if t.job == job] for job in order if spec.count(job)}
    )
    gpus = _assign_gpus(spec, ids, gpu_count)
    secret = secret or secrets.token_hex(32)
    replicas = [t for t in ids if t.job == "chief"] + [t for t in ids if t.job == "worker"]
    primary = replicas[0]
    common = {
        "SHOAL_JOB_NAME": spec.name,
        "SHOAL_JOB_ID": job_id,
        "SHOAL_JOB_SECRET": secret,
        "OUTPUT_DIR": str(model_dir),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(ports[-1]),
        "WORLD_SIZE": str(len(replicas)),
        "PYTHONUNBUFFERED": "1",
    }
    tasks = []
    for task in sorted(ids, key=lambda t: order.index(t.job)):
        role = spec.role(task.job)
        env = {"TF_CONFIG": ClusterConfig(cluster, task).to_tf_config(), **common,
               "SHOAL_TASK": str(task)}
        if task in replicas:
            env["RANK"] = str(replicas.index(task))
        if gpus[task]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus[task]))
        elif gpu_count:
            env["CUDA_VISIBLE_DEVICES"] = ""  # keep CPU-only tasks (ps) off the GPUs
        if role.cpus:
            env["OMP_NUM_THREADS"] = str(max(1, int(role.cpus)))
        env.update(spec.env)
        env.update(role.env)
        tasks.append(TaskPlan(
            task=task,
            label=f"{spec.name}.{task.job}.{task.index}",
            address=addresses[task],
            argv=_argv(role.run or spec.run, python),
            env=tuple(env.items()),
            log_path=str(job_dir / "logs" / f"{task.job}.{task.index}.log"),
            gpus=gpus[task],
        ))
    return JobPlan(
        job_id=job_id, name=spec.name, job_dir=str(job_dir), model_dir=str(model_dir),
        workdir=str(workdir), tasks=tuple(tasks), primary=primary, restart=spec.restart,
        deadline=spec.deadline, grace_period=spec.grace_period,
    )


def format_plan(plan: JobPlan) -> str:
    """The plan as text: a header, then per task one shell line that runs it exactly."""
    restart = plan.restart
    policy = restart.policy.value
    if policy != "never":
        policy += f" (max {restart.max_restarts} restarts, backoff {restart.backoff:g}s)"
    lines = [
        f"job {plan.job_id}",
        f"  job dir:    {plan.job_dir}",
        f"  model dir:  {plan.model_dir}",
        f"  workdir:    {plan.workdir}",
        f"  chief:      {plan.primary}",
        f"  restart:    {policy}",
        f"  deadline:   {f'{plan.deadline:g}s' if plan.deadline else 'none'}",
        f"  grace:      {plan.grace_period:g}s",
        "",
    ]
    for task in plan.tasks:
        gpus = f"  gpus {','.join(map(str, task.gpus))}" if task.gpus else ""
        lines.append(f"# {task.label}  {task.address}{gpus}  log {task.log_path}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in task.env)
        lines.append(f"cd {shlex.quote(plan.workdir)} && env {env} {shlex.join(task.argv)}")
        lines.append("")
    return "\n".join(lines)


def _argv(run: object, python: str) -> tuple[str, ...]:
    argv = shlex.split(run) if isinstance(run, str) else [str(a) for a in run]  # type: ignore
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = python
    return tuple(argv)


def _assign_gpus(spec: JobSpec, ids: list[TaskId], gpu_count: int) -> dict:
    wanted = sum(spec.role(t.job).gpus for t in ids)
    if wanted and gpu_count == 0:
        roles = sorted({t.job for t in ids if spec.role(t.job).gpus})
        raise PlanError(
            f"roles {', '.join(roles)} ask for {wanted} GPU(s) in all, but no NVIDIA GPU was"
            " found on this host (nvidia-ml-py missing or reports none); set gpus: 0, or"
            " pip install nvidia-ml-py on a machine with GPUs"
        )
    if wanted > gpu_count:
        raise PlanError(
            f"the job asks for {wanted} GPUs in all but this host has {gpu_count};"
            " lower roles.<role>.gpus or the counts"
        )
    out, next_gpu = {}, 0
    for task in ids:
        n = spec.role(task.job).gpus
        out[task] = tuple(range(next_gpu, next_gpu + n))
        next_gpu += n
    return out
