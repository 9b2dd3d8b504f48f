"""`make_plan`: render a JobSpec on an Allocation into a JobPlan — every task's argv,
address, environment (TF_CONFIG included) and log file — and `format_plan`, which prints it
as it would run (`--dry-run`), the job secret masked.

Pure: no sockets, no processes, no environment reads. Where tasks run (hosts, ports, GPUs,
interpreter) comes from the executor's `allocate` (see allocation.py).
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Optional

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.launch.allocation import ROLE_ORDER, Allocation, TaskAllocation
from shoal.launch.errors import PlanError
from shoal.launch.relocation import MOVABLE_ROLES
from shoal.launch.spec import JobSpec, RestartSpec, WatchdogSpec
from shoal.launch.watchdog import effective_stall

PYTHON_NAMES = ("python", "python3")
"""A command starting with one of these runs under the allocation's Python."""

SECRET_VARIABLE = "SHOAL_JOB_SECRET"
HIDDEN_SECRET = "<hidden: fresh per job>"
"""What the dry run prints instead of the job secret (the real run makes a new one)."""


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
    gpus: tuple[str, ...] = ()
    node: str = ""
    """The machine it runs on as the executor names it ("" for this machine)."""

    @property
    def name(self) -> str:
        """"worker.1": the task's name in logs, records and `--task`."""
        return f"{self.task.job}.{self.task.index}"

    @property
    def env_dict(self) -> dict[str, str]:
        """The launcher-set variables as a dict."""
        return dict(self.env)


@dataclass(frozen=True)
class RoleTemplate:
    """What a task added to a scalable role (`shoal scale`), or moved off a lost host
    (relocation.py), runs: the role's argv, the variables
    every task of the role gets before its own identity (TF_CONFIG, SHOAL_TASK, RANK,
    WORLD_SIZE) and GPUs are set (`added_task` sets them), and how many GPUs a task of the role
    asks for. Rendered from the spec, so a role that starts with no task (count: 0..N) has one."""

    role: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpus: int = 0


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
    watchdog: WatchdogSpec = field(default_factory=WatchdogSpec)
    scale: tuple[tuple[str, int, int], ...] = ()
    """(role, min, max) of each role whose count `shoal scale` may change (spec: count: MIN..MAX)."""
    templates: tuple[RoleTemplate, ...] = ()
    """The template of each role in `scale`, and of each role whose tasks may move to another
    host (relocation.MOVABLE_ROLES): what a task added to it runs."""

    def template(self, role: str) -> Optional[RoleTemplate]:
        """The RoleTemplate of `role`, or None if it does not scale."""
        return next((t for t in self.templates if t.role == role), None)

    def scale_range(self, role: str) -> Optional[tuple[int, int]]:
        """(min, max) of `role`'s count, or None if it is fixed."""
        for job, low, high in self.scale:
            if job == role:
                return low, high
        return None


def new_job_id(name: str, now: Optional[_dt.datetime] = None) -> str:
    """A fresh, sortable job id: "<name>-YYYYMMDD-HHMMSS-<4 hex>"."""
    now = now or _dt.datetime.now()
    return f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def is_job_id(name: str, job_id: str) -> bool:
    """Whether `job_id` is of the form `new_job_id(name)` makes."""
    return re.fullmatch(re.escape(name) + r"-\d{8}-\d{6}-[0-9a-f]{4}", job_id) is not None


def job_dir_for(shoal_home: Path, job_id: str) -> Path:
    """Job `job_id`'s folder (logs; the model dir by default): <shoal home>/jobs/<id>, absolute."""
    return (shoal_home / "jobs" / job_id).resolve()


def own_model_dir(job_dir: Path) -> Path:
    """The model dir of a job given none (`output_dir:`): inside its folder, new for every job."""
    return job_dir / "model"


CHECKPOINTS_DIR = "checkpoints"
"""The chief's checkpoints inside a model dir (docs/checkpoints.md): `checkpoints/ckpt-<step>`."""


def job_workdir(spec: JobSpec, cwd: Path) -> Path:
    """Where the job's tasks run: spec.workdir (relative to `cwd`, where shoal was started),
    else `cwd`; absolute."""
    return (cwd / spec.workdir if spec.workdir else cwd).resolve()


def make_plan(
    spec: JobSpec,
    allocation: Allocation,
    *,
    job_id: str,
    shoal_home: Path,
    workdir: Path,
    secret: Optional[str] = None,
) -> JobPlan:
    """Render `spec` as job `job_id` on `allocation` (which must come from allocating this
    spec). `workdir` (absolute) is where shoal was started; a relative spec.workdir or
    output_dir is taken from there. `secret` defaults to a fresh random one."""
    job_dir = job_dir_for(shoal_home, job_id)
    workdir = job_workdir(spec, workdir)
    if spec.output_dir:
        out = Path(spec.output_dir).expanduser()
        model_dir = out if out.is_absolute() else workdir / out
    else:
        model_dir = own_model_dir(job_dir)
    places = allocation.tasks
    cluster = ClusterSpec.from_dict({
        job: [p.address for p in places if p.task.job == job]
        for job in ROLE_ORDER if spec.count(job)
    })
    replicas = [p.task for p in places if p.task.job == "chief"]
    replicas += [p.task for p in places if p.task.job == "worker"]
    common = {
        "SHOAL_JOB_NAME": spec.name,
        "SHOAL_JOB_ID": job_id,
        SECRET_VARIABLE: secret or secrets.token_hex(32),
        "OUTPUT_DIR": str(model_dir),
        "MASTER_ADDR": allocation.master_host,
        "MASTER_PORT": str(allocation.master_port),
        "WORLD_SIZE": str(len(replicas)),
        "PYTHONUNBUFFERED": "1",
    }
    tasks = []
    for place in places:
        task, role = place.task, spec.role(place.task.job)
        identity = {"TF_CONFIG": ClusterConfig(cluster, task).to_tf_config(), "SHOAL_TASK": str(task)}
        if task in replicas:
            identity["RANK"] = str(replicas.index(task))
        tasks.append(TaskPlan(
            task=task,
            label=f"{spec.name}.{task.job}.{task.index}",
            address=place.address,
            argv=_argv(role.run or spec.run, allocation.python),
            env=tuple(_task_env(spec, task.job, dict(allocation.env), common, identity, place).items()),
            log_path=str(job_dir / "logs" / f"{task.job}.{task.index}.log"),
            gpus=place.gpus,
            node=place.node,
        ))
    templated = [job for job, _, _ in spec.scale_ranges()]
    templated += [job for job in sorted(MOVABLE_ROLES) if job not in templated and any(p.task.job == job for p in places)]
    templates = tuple(
        RoleTemplate(job, _argv(spec.role(job).run or spec.run, allocation.python),
                     tuple(_task_env(spec, job, dict(allocation.env), common, {}, None).items()),
                     spec.role(job).gpus)
        for job in templated)
    return JobPlan(
        job_id=job_id, name=spec.name, job_dir=str(job_dir), model_dir=str(model_dir),
        workdir=str(workdir), tasks=tuple(tasks), primary=replicas[0], restart=spec.restart,
        deadline=spec.deadline, grace_period=spec.grace_period, watchdog=spec.watchdog,
        scale=spec.scale_ranges(), templates=templates,
    )


def _task_env(spec: JobSpec, job: str, base: dict[str, str], common: dict[str, str],
              identity: dict[str, str], place: Optional[TaskAllocation]) -> dict[str, str]:
    """The variables the launcher sets for a task of role `job`: the allocation's, the task's
    identity (TF_CONFIG first, as users read it), the job's, its GPUs (none for a template:
    `place` None), its threads, then the spec's and the role's own, which win."""
    role = spec.role(job)
    env = {**base, **{k: v for k, v in identity.items() if k == "TF_CONFIG"}, **common,
           **{k: v for k, v in identity.items() if k != "TF_CONFIG"}}
    if place is not None:
        env.update(_gpu_env(place))
    if role.cpus:
        env["OMP_NUM_THREADS"] = str(max(1, int(role.cpus)))
    env.update(spec.env)
    env.update(role.env)
    return env


def _gpu_env(place: TaskAllocation) -> dict[str, str]:
    if place.gpus:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, place.gpus))}
    if place.gpu_host:
        return {"CUDA_VISIBLE_DEVICES": ""}  # keep CPU-only tasks (ps) off the GPUs
    return {}


def added_task(plan: JobPlan, place: TaskAllocation, peers: Sequence[TaskPlan],
               ps: Sequence[str] = ()) -> TaskPlan:
    """The TaskPlan of a task added to running job `plan` (`shoal scale`) at `place`: the
    argv and environment of its role's template (`plan.template`; PlanError if the role has
    none), with its own identity —
    TF_CONFIG whose cluster is `peers` (the tasks as they are now) plus itself, SHOAL_TASK,
    RANK and WORLD_SIZE counted in that cluster — its address and its log file. `ps`, when
    given, is `cluster.ps` instead of the ps among `peers`: for an added ps the job's whole ps
    list (ps_roster.PsRoster: every ps that ever ran, the added one at its index), for any other
    task the ps the job started with (the runtime tells it of a ps that joined). Tasks already
    running keep theirs. Pure."""
    task = place.task
    template = plan.template(task.job)
    if template is None:
        raise PlanError(f"{task} cannot be added: roles.{task.job}.count is not a range MIN..MAX,"
                        " so the plan has no template for it")
    if ps and task.job == "ps" and (task.index >= len(ps) or ps[task.index] != place.address):
        raise PlanError(f"{task} at {place.address} is not in the ps list {list(ps)} it is given")
    members = sorted([*((p.task, p.address) for p in peers if p.task != task), (task, place.address)],
                     key=lambda m: (ROLE_ORDER.index(m[0].job), m[0].index))
    jobs: dict = {
        job: {t.index: address for t, address in members if t.job == job}
        for job in ROLE_ORDER if any(t.job == job for t, _ in members)
    }
    if ps:
        jobs["ps"] = list(ps)
    cluster = ClusterSpec.from_dict(jobs)
    replicas = [t for t, _ in members if t.job in ("chief", "worker")]
    env = dict(template.env)
    env.update({"TF_CONFIG": ClusterConfig(cluster, task).to_tf_config(), "SHOAL_TASK": str(task),
                "WORLD_SIZE": str(len(replicas))})
    if task in replicas:
        env["RANK"] = str(replicas.index(task))
    for key, value in _gpu_env(place).items():
        env.setdefault(key, value)  # a CUDA_VISIBLE_DEVICES the spec sets wins, as in make_plan
    job_dir = Path(plan.job_dir)
    return TaskPlan(
        task=task, label=f"{plan.name}.{task.job}.{task.index}", address=place.address,
        argv=template.argv, env=tuple(env.items()),
        log_path=str(job_dir / "logs" / f"{task.job}.{task.index}.log"), gpus=place.gpus,
        node=place.node,
    )


def format_plan(plan: JobPlan, *, show_secret: bool = False) -> str:
    """The plan as text: a header, then per task one shell line that runs it exactly —
    except the job secret, shown as HIDDEN_SECRET (a dry run never uses it) unless
    `show_secret` (then the lines, run by hand, make a working job)."""
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
        f"  watchdog:   {_watchdog_text(plan)}",
        *(f"  scale:      {role} {low}..{high} (shoal scale JOB {role}=N)" for role, low, high in plan.scale),
        "",
    ]
    nodes = list(dict.fromkeys(task.node for task in plan.tasks))
    for node in nodes:
        if node:  # tasks elsewhere: grouped by host, each shell line is what runs there
            names = ", ".join(t.name for t in plan.tasks if t.node == node)
            lines += [f"## on {node}: {names}", ""]
        for task in (t for t in plan.tasks if t.node == node):
            lines += _task_lines(plan, task, show_secret)
    return "\n".join(lines)


def _watchdog_text(plan: JobPlan) -> str:
    chief = next((t.argv for t in plan.tasks if t.task == plan.primary), ())
    stall = effective_stall(plan.watchdog, chief)
    if stall is None:
        return "off"
    return f"{plan.watchdog.action.value} after {stall:g}s without progress"


def _task_lines(plan: JobPlan, task: TaskPlan, show_secret: bool) -> list[str]:
    gpus = f"  gpus {','.join(map(str, task.gpus))}" if task.gpus else ""
    hide = not show_secret
    env = " ".join(f"{k}={shlex.quote(HIDDEN_SECRET if hide and k == SECRET_VARIABLE else v)}"
                   for k, v in task.env)
    return [f"# {task.label}  {task.address}{gpus}  log {task.log_path}",
            f"cd {shlex.quote(plan.workdir)} && env {env} {shlex.join(task.argv)}", ""]


def _argv(run: object, python: str) -> tuple[str, ...]:
    argv = shlex.split(run) if isinstance(run, str) else [str(a) for a in run]  # type: ignore
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = python
    return tuple(argv)
