"""`SlurmExecutor`: runs a job's tasks on the nodes of a Slurm job, each node's tasks through
one host agent (`shoal.launch.agent`) that runs as a step of that job.

`allocate` gets the running Slurm job from its source (the allocation shoal runs in, or one
it submits: slurm_allocation.py, slurm_submit.py), places the tasks on its nodes
(`hosts.place_tasks`: ps tasks one per node first, then training tasks on the least loaded
node; a role's `hosts:` may pin it to named nodes), starts one agent step per node that got
tasks (`srun --overlap -N1 -n1 -w NODE`, with every CPU the job holds there and the node's
tasks' GPUs), and has each agent bind and hold its tasks' ports. Tasks are reached at the
node's Slurm address (NodeAddr). `start` sends a task's argv and environment — the job
secret included — over the agent's stdin: never on a command line.

A node whose agent was lost (its srun or the agent killed, its step scancelled: its tasks end
LOST and the job's policy applies) gets a new agent step when a task is restarted there: the
old step is scancelled and waited for first, so none of its tasks or held ports outlives it;
the new agent holds no ports, and the task binds the port the plan gave it (its address, in
every task's TF_CONFIG, stays the same), as after the SSH executor's reconnect.

Teardown (`close`): every agent stops its tasks (TERM, grace, KILL) and exits, then the
steps — and a job shoal submitted — are scancelled (an srun that is SIGKILLed leaves its
step running, so ending srun is not enough). If the launcher dies, the srun commands get
SIGKILL from the kernel, the agents see their stdin close and stop their tasks, and the
Slurm watchdog (slurm_reaper.py) scancels the steps and the submitted job.

Control from another process (`shoal kill`, `status`, `monitor`) goes through the TaskRefs:
`extra` holds the Slurm job, the agent's step, whether shoal submitted the job and shoal's
job id. A task counts as running while its agent's step (or the job shoal submitted) does;
`kill` cancels them (every task of that node goes with its step); `sample` runs a probe step
on the task's node: the host agent's one-shot `--find SHOAL_JOB_ID --usage S`, as the SSH
executor does over ssh (job_scan.py reads the report); `sweep` (`shoal check`) runs the same
probe with `--kill` when asked (slurm_sweep.py).

`allocate` and `start` must be called from one thread that outlives the job (the srun
commands get the parent-death signal from the thread that started them: a new agent step's
srun is started by its repair's thread, which lives until `close`, host_repairs.py); `close`
from any, once that thread is done starting tasks (a repair still under way is ended, or ends
itself, seeing the executor closed). The constructor does no I/O.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from shoal.cluster import TaskId
from shoal.launch.agent_client import AgentConnection, AgentError, AgentTask, Bound
from shoal.launch.allocation import Allocation, TaskAllocation, task_ids
from shoal.launch.errors import AllocationEndedError, HostUnreachableError, PlanError, StartError, TaskStateUnknown
from shoal.launch.executor import HostCheck, TaskRef, Usage
from shoal.launch.host_repairs import HostRepairs
from shoal.launch.hosts import Host, place_tasks
from shoal.launch.job_scan import find_args, read_report, task_usage
from shoal.launch.plan import JobPlan, TaskPlan
from shoal.launch.slurm import (KIND, SlurmError, SlurmJob, SlurmNode, agent_step_argv, probe_step_argv,
                                step_environment)
from shoal.launch.slurm_allocation import SlurmJobSource
from shoal.launch.slurm_commands import ACTIVE_STATES, SlurmCommands
from shoal.launch.slurm_reaper import SlurmReaper
from shoal.launch.slurm_sweep import sweep_slurm
from shoal.launch.spec import JobSpec
from shoal.wording import counted

ANY_INTERFACE = "0.0.0.0"
_AGENT_CLOSE_S = 15.0
_PROBE_TIMEOUT_S = 30.0
_LIVE_STATES = frozenset({"RUNNING", "CONFIGURING", "SIGNALING", "SUSPENDED"})
"""States of a Slurm job in which its steps may still run (squeue's)."""
_RUNNING_MEMO_S = 0.5
"""How long `_exit_cause` takes its job's being found running as the answer for other tasks."""
_EXIT_CAUSE_TIMEOUT_S = 5.0
"""How long each Slurm command `_exit_cause` runs may take (a task's exit waits for it)."""
_STEP_END_S = 45.0
"""How long a restart waits for the scancelled step of a lost agent to end (Slurm's KillWait
is 30 s by default, after which it KILLs what the step left)."""


class SlurmExecutor:
    """Tasks as processes of Slurm job steps (see the module docstring).

    `commands` runs Slurm's client commands; `source` gives the Slurm job (None: this
    executor only controls recorded tasks); `python` runs the agents and the commands that
    start with `python` (the same path on every node: a shared file system); `base_env` is
    the environment srun runs with and tasks inherit (the launcher's); `dry_run`: `allocate`
    places the tasks without starting anything (ports 0) and `launch_notes` says what a
    real run would do; `agent_timeout` bounds each agent's start and answers.
    """

    kind = KIND

    def __init__(self, *, commands: SlurmCommands, python: str, base_env: Mapping[str, str],
                 source: Optional[SlurmJobSource] = None, dry_run: bool = False,
                 agent_timeout: float = 60.0, notify: Callable[[str], None] = lambda text: None) -> None:
        self._commands = commands
        self._notify = notify
        self._python = python
        self._base_env = dict(base_env)
        self._source = source
        self._dry_run = dry_run
        self._timeout = agent_timeout
        self._lock = threading.Lock()
        self._reaper: Optional[SlurmReaper] = None
        self._job: Optional[SlurmJob] = None
        self._agents: dict[str, AgentConnection] = {}
        self._steps: dict[str, str] = {}  # node -> "JOB.STEP" of its agent
        self._replaced: list[str] = []  # steps of lost agents (scancelled; close cancels them again)
        self._nodes: dict[str, SlurmNode] = {}  # node -> its share of the job, for a new agent step
        self._gpus: dict[str, int] = {}  # node -> the GPUs its agent step asks for
        self._gpu_names: dict[str, tuple[str, ...]] = {}  # node -> the GPUs its first agent step held
        self._node_of: dict[str, str] = {}  # task name -> node
        self._port_of: dict[str, int] = {}
        self._notes = ""
        self._closed = False
        self._repairs = HostRepairs(notify)
        self._starting: dict[str, AgentConnection] = {}  # node -> a new agent step, until it answers
        self._over_said: Optional[tuple[float, str]] = None  # (when, what) `_job_over` said last: `_exit_cause`
        self._over_lock = threading.Lock()  # one `_exit_cause` query at a time
        self._quick_commands: Optional[SlurmCommands] = None  # `_exit_cause`'s, made at its first query

    # --- running a job --------------------------------------------------------------

    def watch_queue(self, listener: Callable[[str], None]) -> bool:
        """See executor.Queued: a job `--slurm` submits waits in the queue; one inside an
        allocation does not (False)."""
        return self._source is not None and self._source.watch_queue(listener)

    def allocate(self, spec: JobSpec) -> Allocation:
        if self._source is None:
            raise PlanError("this SlurmExecutor only controls recorded tasks; give it a source to run a job")
        if self._dry_run:
            job, self._notes = self._source.preview(spec)
        else:
            job = self._source.acquire(spec, self._watchdog())
        self._job = job
        ids = task_ids(spec)
        nodes = {n.name: n for n in job.nodes}
        _check_pinned_nodes(spec.pinned_hosts(), job)
        placed = place_tasks(ids, [Host(n.name) for n in job.nodes], spec.pinned_hosts())
        node_of = {task: placed[task].name for task in ids}
        gpus = _assign_gpus(spec, ids, node_of, nodes)
        master = next((t for t in ids if t.job == "chief"), None) or next(t for t in ids if t.job == "worker")
        on_node = {n.name: [t for t in ids if node_of[t] == n.name] for n in job.nodes}
        used = [n for n in job.nodes if on_node[n.name]]
        for node in used:
            self._notes += f"# on {node.name}: {', '.join(f'{t.job}.{t.index}' for t in on_node[node.name])}\n"
        crowded = [] if job.submitted else _crowded_nodes(spec, job, on_node)  # shoal sized its own job
        for line in crowded:
            if self._dry_run:
                self._notes += f"# {line}\n"
            else:
                self._notify(f"shoal | {line}")
        counts = {n.name: len(on_node[n.name]) + (n.name == node_of[master]) for n in used}
        if self._dry_run:
            bound = {name: Bound((0,) * count) for name, count in counts.items()}
        else:
            bound = self._start_agents(job, used, counts,
                                       {n.name: sum(len(gpus[t]) for t in on_node[n.name]) for n in used})
        ports = {name: list(b.ports) for name, b in bound.items()}
        self._gpu_names = {name: b.gpus.ids for name, b in bound.items() if b.gpus is not None}
        tasks = []
        for task in ids:
            node = nodes[node_of[task]]
            port = ports[node.name].pop(0)
            self._node_of[f"{task.job}.{task.index}"] = node.name
            self._port_of[f"{task.job}.{task.index}"] = port
            tasks.append(TaskAllocation(task, node.address, port, _step_gpus(gpus[task], node.name, bound[node.name]),
                                        gpu_host=node.gpus > 0))
        master_node = nodes[node_of[master]]
        return Allocation(tasks=tuple(tasks), master_host=master_node.address,
                          master_port=ports[master_node.name].pop(0), python=self._python)

    def launch_notes(self) -> str:
        """What a dry run shows besides the plan: the Slurm job and how tasks reach it."""
        return self._notes

    def start(self, job: JobPlan, task: TaskPlan) -> AgentTask:
        with self._lock:
            if self._closed:
                raise RuntimeError("SlurmExecutor.start after close")
            node = self._node_of.get(task.name)
            agent = self._agents.get(node or "")
        if node is None or agent is None or self._job is None:
            raise StartError(f"{task.label} was not placed on a node of the Slurm job; allocate the job first")
        self._repairs.ensure(node, task.label, lambda: self._replace_agent(node, task),
                             f"starting a new agent step to restart {task.name} (its agent was lost)",
                             usable=lambda: self._agent_alive(node))
        with self._lock:
            agent = self._agents[node]
        env = {**self._base_env, **task.env_dict}
        extra = {"job": self._job.job_id, "step": self._steps.get(node, ""),
                 "submitted": "1" if self._job.submitted else "0", "shoal_job": job.job_id}
        try:
            handle = agent.start(task.name, task.argv, env, job.workdir, self._port_of.get(task.name),
                                 self._timeout, extra=tuple(extra.items()))
        except AgentError as e:
            over = _job_over(self._commands, self._job.job_id)
            if over:  # cancelled under us: the agent went with it
                raise AllocationEndedError(f"{task.label} cannot be restarted on {node}: {over}") from e
            if not agent.alive:  # lost as the task was started: a new agent step, at the next try
                raise HostUnreachableError(f"{task.label} cannot start on {node} yet: {e}") from e
            raise StartError(f"{task.label} cannot start on {node}: {e}") from e
        handle.explain_exit = self._exit_cause
        return handle

    def _exit_cause(self, code: int) -> str:
        """What ended a task that exited with `code` from outside: its Slurm job, if that is no
        longer running (Slurm ends a job's steps with SIGTERM, then SIGKILL: so only for a task
        killed by a signal); "" otherwise. Blocks: one query at a time, each squeue (and scontrol)
        bounded by _EXIT_CAUSE_TIMEOUT_S; a job found over stays over (the tasks a cancelled or
        requeued job ends together ask once), a job found running is asked again after
        _RUNNING_MEMO_S."""
        if code >= 0 or self._job is None:
            return ""
        with self._over_lock:
            said = self._over_said
            if said is not None and (said[1] or time.monotonic() - said[0] < _RUNNING_MEMO_S):
                return said[1]
            if self._quick_commands is None:
                self._quick_commands = self._commands.with_timeout(_EXIT_CAUSE_TIMEOUT_S)
            over = _job_over(self._quick_commands, self._job.job_id)
            self._over_said = (time.monotonic(), over)
            return over

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            agents, self._agents = [*self._agents.values(), *self._starting.values()], {}
            reaper, self._reaper = self._reaper, None
        with ThreadPoolExecutor(max_workers=max(1, len(agents))) as pool:
            list(pool.map(lambda a: a.close(timeout=_AGENT_CLOSE_S), agents))
        self._repairs.close()  # after the agents: a new agent's srun ends with its repair's thread
        steps = [*self._steps.values(), *self._replaced]
        try:
            self._commands.cancel(steps)  # an agent that did not exit goes with its step
        except SlurmError:
            steps = []  # left registered: the watchdog scancels them when the reaper closes below
        if reaper is not None:
            for step in steps:
                reaper.remove(step)
        try:
            if self._source is not None and not self._dry_run:
                self._source.release(reaper)
        finally:
            if reaper is not None:
                reaper.close()

    # --- control of recorded tasks (any process) ------------------------------------

    def alive(self, ref: TaskRef) -> bool:
        extra = dict(ref.extra)
        job, step = extra.get("job", ""), extra.get("step", "")
        if not job:
            return False
        try:
            if step and step in self._commands.steps(job):
                return True
            return extra.get("submitted") == "1" and self._commands.state(job) in ACTIVE_STATES
        except SlurmError as e:
            raise TaskStateUnknown(f"Slurm could not say whether {step or 'job ' + job} still runs ({e});"
                                   f" check by hand: squeue -s -j {job}, and scancel {step or job}"
                                   " if it is still listed") from e

    def kill(self, ref: TaskRef) -> None:
        extra = dict(ref.extra)
        ids = [extra["step"]] if extra.get("step") else []
        if extra.get("submitted") == "1" and extra.get("job"):
            ids.append(extra["job"])
        try:
            self._commands.cancel(ids)
        except SlurmError as e:
            raise TaskStateUnknown(f"scancel {' '.join(ids)} could not run ({e}); run it by hand once"
                                   " slurmctld answers (scontrol ping)") from e

    def sweep(self, job_id: str, refs: Sequence[TaskRef], kill: bool) -> list[HostCheck]:
        """Every node of `refs` checked for processes of `job_id` (slurm_sweep.py)."""
        return sweep_slurm(self._commands, self._python, self._base_env, job_id, refs, kill)

    def sample(self, refs: Mapping[str, TaskRef], interval: float) -> dict[str, Usage]:
        groups: dict[tuple[str, str, str], dict[str, TaskRef]] = {}
        for name, ref in refs.items():
            extra = dict(ref.extra)
            job, shoal_job = extra.get("job"), extra.get("shoal_job")
            if job and shoal_job and ref.host and ref.pid and ref.started:
                groups.setdefault((job, shoal_job, ref.host), {})[name] = ref
        if not groups:
            return {}
        out: dict[str, Usage] = {}
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            for usage in pool.map(lambda item: self._probe(*item[0], item[1], interval), groups.items()):
                out.update(usage)
        return out

    # --- internals ------------------------------------------------------------------

    def _watchdog(self) -> SlurmReaper:
        with self._lock:
            if self._reaper is None:
                self._reaper = SlurmReaper(self._base_env, self._python)
                self._reaper.start()
            return self._reaper

    def _start_agents(self, job: SlurmJob, nodes: list[SlurmNode], counts: Mapping[str, int],
                      gpus: Mapping[str, int]) -> dict[str, Bound]:
        """One agent step per node, all started before any is waited for; then their ports (and
        the GPUs of the steps that hold some)."""
        for node in nodes:
            self._nodes[node.name], self._gpus[node.name] = node, gpus[node.name]
            agent = self._connection(job, node.name)
            with self._lock:
                if self._closed:
                    raise PlanError("the job was stopped while its agents were starting")
                self._agents[node.name] = agent
            agent.launch()
        reaper = self._watchdog()
        for node in nodes:
            hello = self._agents[node.name].ready(self._timeout)
            if hello.slurm_step:
                self._steps[node.name] = hello.slurm_step
                reaper.add(hello.slurm_step)
        return {node.name: self._agents[node.name].bind(counts[node.name], ANY_INTERFACE, self._timeout,
                                                        gpus=gpus[node.name] > 0)
                for node in nodes}

    def _connection(self, job: SlurmJob, node: str) -> AgentConnection:
        """The agent of `node`, as a step of `job` (not started yet)."""
        return AgentConnection(agent_step_argv(job, self._nodes[node], self._python, self._gpus[node]), node, KIND,
                               env=step_environment(self._base_env, inside=not job.submitted))

    def _agent_alive(self, node: str) -> bool:
        with self._lock:
            agent = self._agents.get(node)
        return agent is not None and agent.alive

    def _replace_agent(self, node: str, task: TaskPlan) -> None:
        """A new agent step on `node`, whose agent was lost, to restart `task` there (see the
        module docstring): the lost agent's step is scancelled and waited for, then the new one
        started and registered with the watchdog; run by HostRepairs on a thread that lives as
        long as the new step's srun. AllocationEndedError if the Slurm job is over;
        HostUnreachableError (the supervisor tries again later) if the old step does not end
        within _STEP_END_S, squeue cannot tell, or the new agent does not start; StartError if
        the job is being stopped. Each says what is wrong with the node, not which task waits.
        Blocks."""
        assert self._job is not None
        with self._lock:
            if self._closed:
                raise StartError("the job is being stopped")
        over = _job_over(self._commands, self._job.job_id)
        if over:
            raise AllocationEndedError(over)
        with self._lock:
            old, old_step = self._agents.get(node), self._steps.get(node, "")
        if old is not None:
            old.close(grace=0.5, timeout=2.0)  # its command already ended: this only reaps it
        if old_step:
            if old_step not in self._replaced:
                self._replaced.append(old_step)
            try:
                ended = _end_step(self._commands, self._job.job_id, old_step, _STEP_END_S)
            except SlurmError as e:
                raise HostUnreachableError(f"not yet: Slurm could not say whether the step of its lost agent,"
                                           f" {old_step}, has ended: {e}") from e
            if not ended:
                raise HostUnreachableError(
                    f"not yet: the step of its lost agent, {old_step}, still runs {_STEP_END_S:g}s after scancel,"
                    f" and its tasks may hold their ports; see why with scontrol show step {old_step} (is slurmd"
                    f" on {node} up?)")
        agent = self._connection(self._job, node)
        with self._lock:
            if self._closed:
                raise StartError("the job is being stopped")
            self._starting[node] = agent  # close() ends it too, should it come while the agent starts
        try:
            agent.launch()
            hello = agent.ready(self._timeout)
            gpus = agent.bind(0, "", self._timeout, gpus=True).gpus if self._gpus.get(node) else None
        except AgentError as e:
            agent.close(grace=0.5, timeout=5.0)  # a later restart tries a new one again
            over = _job_over(self._commands, self._job.job_id)
            if over:
                raise AllocationEndedError(over) from e
            raise HostUnreachableError(f"not yet: a new agent step did not start: {e}") from e
        finally:
            with self._lock:
                self._starting.pop(node, None)
        given = self._gpu_names.get(node, ())
        if gpus is not None and gpus.ids[:len(given)] != given:
            self._end_new_step(agent, hello.slurm_step)
            raise HostUnreachableError(
                f"not yet: its new agent step holds the GPUs {','.join(gpus.ids) or 'none'} where its tasks were"
                f" given {','.join(given)} ({gpus.limited_by or 'counted by nvidia-ml-py'}); Slurm gave the step"
                " other devices (ConstrainDevices=yes in cgroup.conf numbers every step's GPUs from 0)")
        with self._lock:
            closed = self._closed
            if not closed:  # installed once it answered: a start never finds it half up
                self._agents[node] = agent
                if hello.slurm_step:
                    self._steps[node] = hello.slurm_step
            reaper = self._reaper
        if closed:  # close() ran meanwhile, without this agent
            self._end_new_step(agent, hello.slurm_step)
            raise StartError("the job is being stopped")
        if hello.slurm_step:
            (reaper or self._watchdog()).add(hello.slurm_step)  # a reaper closed meanwhile ignores it
        self._notify(f"shoal | {node}: its agent (step {old_step or '?'}) was lost; started step"
                     f" {hello.slurm_step or '?'} to restart {task.name}")

    def _end_new_step(self, agent: AgentConnection, step: str) -> None:
        """Stop a new agent step that will not be used: its agent, then scancel of `step`. Blocks."""
        agent.close(grace=0.5, timeout=5.0)
        try:
            self._commands.cancel([step] if step else [])
        except SlurmError:
            pass  # the agent exited with its stdin, and its srun with it: the step ends anyway

    def _probe(self, job: str, shoal_job: str, node: str, refs: Mapping[str, TaskRef],
               interval: float) -> dict[str, Usage]:
        argv = probe_step_argv(job, node, self._python, find_args(shoal_job, usage=interval))
        env = step_environment(self._base_env, inside=False)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                                  timeout=_PROBE_TIMEOUT_S + interval, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            return {}  # the job or node is gone: nothing runs there to measure
        scan = read_report(node, done.stdout) if done.returncode == 0 else None
        if scan is None:
            return {}
        usage = {name: task_usage(scan, ref) for name, ref in refs.items()}
        return {name: use for name, use in usage.items() if use is not None}


def _job_over(commands: SlurmCommands, job_id: str) -> str:
    """Why nothing can run in Slurm job `job_id` any more (it was cancelled, ran past its time
    limit, lost a node), in words; "" while it runs, or if slurmctld cannot tell. Blocks
    (bounded by the commands' timeout)."""
    try:
        state = commands.state(job_id)
    except SlurmError:
        return ""
    if state in _LIVE_STATES:
        return ""
    try:
        state = commands.detail(job_id).state  # CANCELLED, TIMEOUT, NODE_FAIL: squeue no longer says
    except SlurmError:
        state = state or "over"
    return (f"Slurm job {job_id} is {state} (scancel, its time limit, a node failure, preemption or a requeue ended"
            f" it: sacct -j {job_id} says which), so nothing can run in it any more")


def _end_step(commands: SlurmCommands, job_id: str, step: str, timeout: float) -> bool:
    """scancel `step` of `job_id`, then wait until squeue no longer lists it: True, or False
    if it still runs after `timeout` s. SlurmError if slurmctld cannot tell. Blocks."""
    commands.cancel([step])
    deadline = time.monotonic() + timeout
    while step in commands.steps(job_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def _check_pinned_nodes(pinned: Mapping[str, Sequence[str]], job: SlurmJob) -> None:
    """PlanError naming the Slurm job's nodes if a role's hosts: names a node outside it (under
    Slurm the nodes come from the job, not from a hosts: list the fix could add to)."""
    names = [n.name for n in job.nodes]
    for role, wanted in pinned.items():
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise PlanError(f"roles.{role}.hosts names {', '.join(map(repr, unknown))}, which Slurm job"
                            f" {job.job_id} does not hold (its nodes: {', '.join(names)}); name nodes of the"
                            f" job in roles.{role}.hosts, or ask Slurm for those (salloc -w NODE,...)")


def _crowded_nodes(spec: JobSpec, job: SlurmJob, on_node: Mapping[str, list[TaskId]]) -> list[str]:
    """A line per node where the tasks placed ask for more CPUs than the Slurm job holds there
    (a task without `cpus:` counts 1): they run, sharing those CPUs, slower than asked."""
    lines = []
    for node in job.nodes:
        tasks = on_node.get(node.name, [])
        asked = sum(max(1, math.ceil(spec.role(t.job).cpus or 1)) for t in tasks)
        if asked > node.cpus:
            lines.append(f"warning: Slurm job {job.job_id} holds {counted(node.cpus, 'CPU')} on"
                         f" {node.name}, where {', '.join(f'{t.job}.{t.index}' for t in tasks)} ask for {asked}"
                         " (1 for a task without cpus:); they share them, slower: ask Slurm for more"
                         " (salloc -n TASKS, --cpus-per-task) or give the roles fewer cpus:")
    return lines


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _step_gpus(indexes: tuple[int, ...], node: str, bound: Bound) -> tuple[str, ...]:
    """The GPUs of a task, `indexes` into those its node's agent step holds, as the step's
    CUDA_VISIBLE_DEVICES names them (Slurm's own numbers, where it confines no devices); the
    indexes themselves in a dry run. PlanError if the step sees fewer than that."""
    if not indexes or bound.gpus is None:
        return tuple(str(i) for i in indexes)
    if max(indexes) >= len(bound.gpus):
        limit = bound.gpus.limited_by or "no CUDA_VISIBLE_DEVICES: counted by nvidia-ml-py"
        raise PlanError(f"{node}: its agent step sees {len(bound.gpus)} GPUs ({limit}) but its tasks need at least "
                        f"{max(indexes) + 1}; check the cluster's GPU gres configuration (gres.conf), and that"
                        " nvidia-ml-py is installed on the node")
    return tuple(bound.gpus.ids[i] for i in indexes)


def _assign_gpus(spec: JobSpec, ids: list[TaskId], node_of: Mapping[TaskId, str],
                 nodes: Mapping[str, SlurmNode]) -> dict[TaskId, tuple[int, ...]]:
    """Distinct GPUs of its node for each task that asks for them (indexes within the node's
    agent step, which asks Slurm for exactly that many); PlanError if a node has too few."""
    asking = {node: sum(spec.role(t.job).gpus for t in ids if node_of[t] == node) for node in nodes}
    short = []
    for node, want in asking.items():
        if want > nodes[node].gpus:
            tasks = ", ".join(f"{t.job}.{t.index}" for t in ids if node_of[t] == node and spec.role(t.job).gpus)
            short.append(f"on {node}, {tasks} {'asks' if ', ' not in tasks else 'ask'} for {_gpus(want)} and the"
                         f" job holds {nodes[node].gpus} there")
    if short:
        raise PlanError(f"the Slurm job holds too few GPUs: {'; '.join(short)}; ask Slurm for more"
                        " (e.g. salloc --gpus-per-node=N or --gpus-per-task), lower roles.<role>.gpus, or pin"
                        " roles to nodes with hosts:")
    out: dict[TaskId, tuple[int, ...]] = {}
    used: dict[str, int] = {}
    for task in ids:
        want = spec.role(task.job).gpus
        node = node_of[task]
        first = used.get(node, 0)
        out[task] = tuple(range(first, first + want))
        used[node] = first + want
    return out
