"""`SshExecutor`: runs a job's tasks on other machines, through one host agent per machine
(`python -m shoal.launch.agent`, started with the system's ssh; see agent.py).

Running a job:

* `allocate` places the tasks (hosts.place_tasks: ps spread first, workers fill slots, roles
  may pin hosts), copies the workdir first when the spec says `sync: true` (ssh_sync), starts
  every host's agent at once — which is the check that each host can run the job, failing
  with one line per bad host before anything starts (ssh_preflight) — and has each agent bind
  and *hold* its tasks' ports (and count its GPUs when the job wants some). Tasks listen on
  the address ssh reached their host at (the agent's hello).
* `start` has the task's agent start it: argv, workdir and the environment (the job secret in
  it) travel over the ssh channel's stdin, never on a command line. The task's output and exit
  come back through the agent (AgentTask is the TaskHandle). A host whose agent is silent for
  the heartbeat timeout is given up: its tasks end LOST (255) and the job's policy applies; a
  task restarted there reconnects first, and kills what the lost agent left of the job there.
  The reconnect runs in the background (host_repairs.py: StartDeferred meanwhile, so the
  supervisor serves the job while ssh waits for the host); HostUnreachableError while the host
  stays unreachable: the supervisor tries again later.
* `place_task` (`shoal scale`: a worker or ps added to the running job) picks the connected
  host of the job with the fewest tasks and, for a worker, a free slot (hosts.host_for_added) —
  counting the tasks that hold their place now, as the supervisor says, so the slots of
  scaled-down or ended tasks are free again — and has its agent bind and hold one more port
  (the agent's `bind` message, again); `start` then starts it as any task. A task of a role
  with `gpus:` goes only to a host with that many GPUs no running task holds, and gets those.
  A role's `hosts:` pin is not known here, so an added task may land on any host of the job.
* `close` stops every agent (each stops its tasks: TERM, grace, KILL), then checks every host
  for processes of the job (by SHOAL_JOB_ID in their environment), kills any it finds, and
  reports through `notify`: "no process left on ..." or the survivors by host and pid. The
  same check says whether the host sees the launcher's model dir (a marker file the launcher
  left there); from a host that does not, what the tasks wrote into the model dir there
  (summaries; not checkpoints, which only the chief writes) is copied back (ssh_sync).

Control from any process (`shoal kill`, `status`, `monitor`, `check`) uses the TaskRefs: each
names its host and how to run the agent there (ssh_control.AgentSite), and one ssh call per
host runs the agent's one-shot mode. `alive` results are kept for a second per host, so a
loop over a job's tasks costs one call per host.

The constructor does no I/O. `allocate` and `start` must run on one thread that outlives the
job (the agents' ssh commands die with it); `close` and the control calls from any thread.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from shoal.cluster import TaskId
from shoal.launch.agent_client import AgentConnection, AgentError, AgentTask
from shoal.launch.allocation import (FREE_GPUS_HINT, Allocation, TaskAllocation, assign_gpus, free_gpus,
                                     take_free_gpus, task_ids)
from shoal.launch.errors import HostsError, HostUnreachableError, PlanError, StartError
from shoal.launch.executor import HostCheck, TaskRef, Usage
from shoal.launch.host_repairs import HostRepairs
from shoal.launch.hosts import Host, host_for_added, place_tasks
from shoal.launch.job_scan import HostScan, host_check, is_member, task_usage
from shoal.launch.plan import JobPlan, TaskPlan, job_workdir
from shoal.launch.setup_signals import stop_signal_name
from shoal.launch.spec import JobSpec
from shoal.launch.ssh import SshOptions, agent_args, ssh_argv
from shoal.launch.ssh_control import AgentSite, scan
from shoal.launch.ssh_preflight import close_all, is_unreachable, open_agents
from shoal.launch.ssh_sync import collect_model_dirs, sync_workdir
from shoal.launch.visible_gpus import VisibleGpus, unchecked_notice

KIND = "ssh"
_HELLO_GRACE = 20.0
"""Seconds an agent may take to start on a reachable host (beyond the connect timeout)."""
LOST_HOST_CHECK_S = 8.0
"""How long the last check waits for a host whose agent was lost (a host still gone costs this)."""
_REQUEST_TIMEOUT = 30.0
_ALIVE_CACHE_S = 1.0
MARKER_PREFIX = ".shoal-launcher-"
"""A file the launcher leaves in the model dir while the job runs (see `close`)."""


def _ignore(_line: str) -> None:
    pass


class SshExecutor:
    """Tasks on remote hosts through their agents (see the module docstring).

    `hosts` are the job's hosts (none for an executor that only controls recorded tasks);
    `python` the interpreter on the hosts; `cwd` where shoal was started (the workdir, same
    path on every host); `forward_env` the launcher's variables every task gets (PYTHONPATH
    and such; never the secret); `version` this launcher's Shoal version and `fingerprint` the
    hash of its code (fingerprint.py), which every agent must match; `notify` takes the lines
    that report on the hosts (lost agents, the final check)."""

    kind = KIND

    def __init__(self, hosts: Sequence[Host] = (), *, python: str, cwd: Path,
                 options: SshOptions = SshOptions(), forward_env: Optional[Mapping[str, str]] = None,
                 version: str = "", fingerprint: Optional[str] = None,
                 notify: Callable[[str], None] = _ignore) -> None:
        self._hosts = tuple(hosts)
        self._python = python
        self._cwd = cwd
        self._options = options
        self._forward = dict(forward_env or {})
        self._version = version
        self._fingerprint = fingerprint
        self._notify = notify
        self._workdir = ""
        self._conns: dict[str, AgentConnection] = {}
        self._gpus_of: dict[str, VisibleGpus] = {}  # host -> the GPUs its agent named
        self._job_id: Optional[str] = None
        self._lock = threading.Lock()
        self._closed = False
        self._alive_cache: dict[tuple[str, str], tuple[float, HostScan]] = {}
        self._marker = ""
        self._repairs = HostRepairs(notify)

    # --- running a job --------------------------------------------------------------

    def allocate(self, spec: JobSpec) -> Allocation:
        ids = task_ids(spec)
        placement = place_tasks(ids, self._hosts, spec.pinned_hosts())
        used = [h.name for h in self._hosts if any(p.name == h.name for p in placement.values())]
        self._workdir = str(job_workdir(spec, self._cwd))
        if spec.sync:
            try:
                sync_workdir(used, self._workdir, self._options)
            except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (setup_signals.py): the copies are ended
                self._notify(f"shoal | stopped by {stop_signal_name(e)} while copying {self._workdir} to"
                             f" {', '.join(used)} (sync: true); the copy was ended and nothing was started")
                raise
            self._notify(f"shoal | copied {self._workdir} to {', '.join(used)} (sync: true)")
        conns = open_agents(used, self._connection, timeout=self._options.connect_timeout + _HELLO_GRACE,
                            python=self._python, workdir=self._workdir, version=self._version,
                            fingerprint=self._fingerprint, config=self._options.config)
        with self._lock:
            self._conns.update(conns)
        try:
            return self._place(spec, ids, {t: h.name for t, h in placement.items()}, used)
        except BaseException:
            self.close()
            raise

    def _place(self, spec: JobSpec, ids: list[TaskId], node_of: dict[TaskId, str],
               used: list[str]) -> Allocation:
        replicas = [t for t in ids if t.job in ("chief", "worker")]
        master_node = node_of[replicas[0]]
        wants_gpus = spec.uses_gpus()
        places: dict[TaskId, TaskAllocation] = {}
        master: tuple[str, int] = ("", 0)
        for node in used:
            conn = self._conns[node]
            assert conn.hello is not None
            mine = [t for t in ids if node_of[t] == node]
            try:
                bound = conn.bind(len(mine) + (node == master_node), conn.hello.host, _REQUEST_TIMEOUT,
                                  gpus=wants_gpus)
            except AgentError as e:
                raise HostsError(f"{node} cannot hold ports for the job (nothing was started): {e}") from e
            if bound.gpus is not None:
                self._gpus_of[node] = bound.gpus
                if bound.gpus.unchecked:
                    self._notify(unchecked_notice(bound.gpus, node))
            try:
                gpus = assign_gpus(spec, mine, bound.gpus or VisibleGpus())
            except PlanError as e:
                raise PlanError(f"{node}: {e}") from e
            for task, port in zip(mine, bound.ports, strict=False):
                places[task] = TaskAllocation(task, conn.hello.host, port, gpus[task],
                                              gpu_host=bool(bound.gpus), node=node)
            if node == master_node:
                master = (conn.hello.host, bound.ports[-1])
        return Allocation(tasks=tuple(places[t] for t in ids), master_host=master[0], master_port=master[1],
                          python=self._python, env=tuple(self._forward.items()))

    def place_task(self, job: JobPlan, task: TaskId, running: Sequence[TaskPlan],
                   avoid: Collection[str] = ()) -> TaskAllocation:
        """Where a task added to the running job runs (see the module docstring): PlanError if
        no connected host of the job outside `avoid` has a free slot or its agent cannot bind a
        port. `running` are the tasks that hold their place now (executor.TaskPlacer)."""
        with self._lock:
            conns = {name: c for name, c in self._conns.items() if c.alive and c.hello is not None}
        eligible = [name for name in conns if name not in avoid]  # hosts that could not start it are left out
        template = job.template(task.job)
        want = template.gpus if template else 0
        if want:
            eligible = self._with_free_gpus(want, task, {name: conns[name] for name in eligible}, running)
        host = host_for_added(task, self._hosts, eligible, [(t.node, t.task.job) for t in running])
        conn = conns[host.name]
        assert conn.hello is not None
        uses_gpus = any(t.gpus for t in job.templates) or any(t.gpus for t in job.tasks)
        visible = self._host_gpus(host.name, conn, task) if uses_gpus else VisibleGpus()  # CPU tasks: kept off
        gpus = take_free_gpus(want, visible, _held_gpus(running, host.name), task, host.name)
        try:
            bound = conn.bind(1, conn.hello.host, _REQUEST_TIMEOUT)
        except AgentError as e:
            raise PlanError(f"{host.name} cannot hold a port for {task}: {e}") from e
        return TaskAllocation(task, conn.hello.host, bound.ports[0], gpus, gpu_host=len(visible) > 0, node=host.name)

    def _with_free_gpus(self, want: int, task: TaskId, hosts: Mapping[str, AgentConnection],
                        running: Sequence[TaskPlan]) -> list[str]:
        """The hosts of `hosts` with `want` GPUs that no running task holds (asking an agent
        that was not asked yet); PlanError naming each host's free GPUs when none has enough."""
        free: dict[str, tuple[int, int]] = {}  # host -> (free, all)
        unknown: dict[str, str] = {}  # host -> why it could not say
        for name, conn in hosts.items():
            try:
                gpus = self._host_gpus(name, conn, task)
            except PlanError as e:  # one silent host does not keep the task off the others
                unknown[name] = str(e)
                continue
            free[name] = (len(free_gpus(gpus, _held_gpus(running, name))), len(gpus))
        fit = [name for name in free if free[name][0] >= want]
        if not fit:
            counts = ", ".join([f"{name} {n} of {of}" for name, (n, of) in free.items()] +
                               [f"{name} unknown: {why}" for name, why in unknown.items()]) or "no connected host"
            raise PlanError(f"{task} asks for {want} GPU(s) and no host of the job has that many free"
                            f" (free: {counts}); {FREE_GPUS_HINT}")
        return fit

    def _host_gpus(self, name: str, conn: AgentConnection, task: TaskId) -> VisibleGpus:
        """The GPUs host `name`'s tasks may use, as its agent named them (asked once); PlanError
        if it cannot say."""
        if name not in self._gpus_of:
            try:
                bound = conn.bind(0, "", _REQUEST_TIMEOUT, gpus=True)
            except AgentError as e:
                raise PlanError(f"{name} cannot say which GPUs it has, for {task}: {e}") from e
            self._gpus_of[name] = bound.gpus or VisibleGpus()
            if self._gpus_of[name].unchecked:
                self._notify(unchecked_notice(self._gpus_of[name], name))
        return self._gpus_of[name]

    def start(self, job: JobPlan, task: TaskPlan) -> AgentTask:
        with self._lock:
            if self._closed:
                raise RuntimeError("SshExecutor.start after close")
            first, self._job_id = self._job_id is None, job.job_id
        if first:
            self._mark_model_dir(job)
        self._repairs.ensure(task.node, task.label, lambda: self._reconnect(task),
                             f"connecting again to restart {task.name} (its agent was lost)",
                             usable=lambda: self._connected(task.node))
        with self._lock:
            conn = self._conns[task.node]
        site = self._site(task.node)
        extra = (("job", job.job_id), ("task", str(task.task)), *site.to_extra())
        try:
            return conn.start(task.name, task.argv, task.env_dict, job.workdir, _port(task.address),
                              _REQUEST_TIMEOUT, inherit_env=True, extra=extra)
        except AgentError as e:
            _kill_unconfirmed(conn, task.name)
            raise StartError(f"{task.label} could not be started on {task.node}: {e}") from e

    def _connected(self, node: str) -> bool:
        with self._lock:
            conn = self._conns.get(node)
        return conn is not None and conn.alive

    def _reconnect(self, task: TaskPlan) -> None:
        """A new agent on the host of `task`, whose old one was lost, installed once what the
        old one left of the job there is killed (see `_clear_lost_host`); run by HostRepairs on
        a thread that lives as long as the new agent's ssh. HostUnreachableError, for the
        supervisor to try again later, while the host does not answer or cannot be cleared;
        StartError if it answers but cannot run the job (its workdir or interpreter gone) or the
        job is being stopped; each says what is wrong with the host, not which task waits. The
        Shoal version is checked again, not the code's fingerprint: a checkout edited during a
        long job runs the edited code in every task anyway. Blocks (bounded: the connect timeout
        and _HELLO_GRACE, then one check of the host)."""
        try:
            conns = open_agents([task.node], self._connection,
                                timeout=self._options.connect_timeout + _HELLO_GRACE,
                                python=self._python, workdir=self._workdir or str(self._cwd), version=self._version,
                                fingerprint=None, config=self._options.config)
        except HostsError as e:
            problem = str(e).splitlines()[-1].strip()
            if not is_unreachable(task.node, problem):
                raise StartError(problem) from e
            raise HostUnreachableError(problem) from e
        conn = conns[task.node]
        with self._lock:
            lost = self._conns.get(task.node)
        try:
            self._clear_lost_host(task, lost)
        except BaseException:
            conn.close(0.5, 5.0)  # the next try reconnects, and clears, again
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                self._conns[task.node] = conn
        if closed:
            conn.close(0.5, 5.0)
            raise StartError("the job is being stopped")
        if lost is not None:
            threading.Thread(target=lost.close, args=(0.5, 2.0), daemon=True).start()
        self._notify(f"shoal | {task.node}: reconnected to restart {task.name}")

    def _clear_lost_host(self, task: TaskPlan, lost: Optional[AgentConnection]) -> None:
        """Kill the lost agent of `task`'s host and the job's processes it left there. An agent
        that was only silent (stopped, starved) leaves its tasks running: a restarted copy beside
        them would find its port taken, or the chief its model dir locked. The new agent has
        started nothing yet, so every process of the job there is the old agent's.
        HostUnreachableError if the host cannot be checked or a process survives SIGKILL.
        Blocks (bounded)."""
        node = task.node
        if self._job_id is None:
            return
        found = scan([self._site(node)], self._job_id, options=self._options, kill=True,
                     kill_agent=_agent_of(lost))[node]
        if found.agent_killed and lost is not None and lost.hello is not None:
            self._notify(f"shoal | {node}: its lost agent (pid {lost.hello.pid}) still ran; killed")
        check = host_check(found)
        for proc in check.found:
            fate = "survived SIGKILL" if proc in check.survivors else "killed"
            self._notify(f"shoal | {node}: {proc.task or 'a process'} pid {proc.pid} ({proc.command}) still ran"
                         f" after its agent was lost; {fate} before the restart")
        if check.error or check.survivors:
            raise HostUnreachableError(
                f"not yet: what its lost agent left running there could not be checked ({check.error})"
                if check.error else "not yet: a process its lost agent left there survived SIGKILL (above)")

    def _mark_model_dir(self, job: JobPlan) -> None:
        """Leave a file in the launcher's model dir; a host that does not see it at the end
        does not share the model dir (its tasks' summaries are then copied back)."""
        marker = Path(job.model_dir) / f"{MARKER_PREFIX}{job.job_id}"
        try:
            marker.touch()
        except OSError:
            return  # the model dir cannot be written here; the tasks will say so
        self._marker = str(marker)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns, self._conns = dict(self._conns), {}
            job_id = self._job_id
        close_all(conns.values())
        self._repairs.close()  # after close_all: the new agents' ssh end with their repair's thread
        lost = {node: conn.lost for node, conn in conns.items() if conn.lost}
        scans = self._final_scans([n for n in conns if n not in lost], list(lost), job_id, conns) if job_id else {}
        unchecked = [node for node in lost if node not in scans or scans[node].error]
        for node in unchecked:
            again = scans[node].error.removeprefix(f"{node}: ") if node in scans else ""
            why = f"; a new connection failed too: {again}" if again else ""
            self._notify(f"shoal | {node}: not checked, its agent was lost ({lost[node]}{why}); cut off from the"
                         f" launcher, it stops the job's tasks after {self._options.heartbeat:g}s by itself"
                         f" (shoal check {job_id or 'JOB'} confirms it once {node} is back)")
        if job_id is None:
            return
        self._report([host_check(s) for node, s in scans.items() if node not in unchecked], job_id)
        if self._marker:
            self._collect([s.host for s in scans.values() if s.has is False], str(Path(self._marker).parent))
            Path(self._marker).unlink(missing_ok=True)

    def _final_scans(self, connected: list[str], lost: list[str], job_id: str,
                     lost_agents: Mapping[str, AgentConnection]) -> dict[str, HostScan]:
        """Every host checked (and cleaned) for the job's processes, all at once. A host whose
        agent was lost is checked too, over a new connection, for at most LOST_HOST_CHECK_S: it
        may be back (a link that came up again), and its tasks may still run if it never lost
        us; its lost agent (`lost_agents`), if it still runs there (stopped), is killed. Blocks."""
        if lost:
            self._notify(f"shoal | checking {', '.join(lost)} again over a new connection (its agent was lost;"
                         f" up to {LOST_HOST_CHECK_S:g}s)")
        with ThreadPoolExecutor(max_workers=1 + len(lost)) as pool:
            checks = [pool.submit(scan, [self._site(n) for n in connected], job_id, options=self._options,
                                  kill=True, has=self._marker)] if connected else []
            checks += [pool.submit(scan, [self._site(n)], job_id, options=self._options, kill=True, has=self._marker,
                                   timeout=LOST_HOST_CHECK_S, kill_agent=_agent_of(lost_agents.get(n)))
                       for n in lost]  # one by one: each may have a lost agent of its own to kill
            found = {host: scan_ for check in checks for host, scan_ in check.result().items()}
        for node in lost:
            if node in found and found[node].agent_killed:
                self._notify(f"shoal | {node}: its lost agent still ran; killed")
        return found

    def _collect(self, nodes: list[str], model_dir: str) -> None:
        """Copy the model dirs of hosts that do not share the launcher's into it."""
        if not nodes:
            return
        for node, problem in collect_model_dirs(nodes, model_dir, self._options).items():
            if problem:
                self._notify(f"shoal | {node} does not share the model dir {model_dir}, and its files could not"
                             f" be copied here: {problem}")
            else:
                self._notify(f"shoal | {node} does not share the model dir: copied what its tasks wrote there"
                             f" (not checkpoints) into {model_dir}")

    def _report(self, checks: list[HostCheck], job_id: str) -> None:
        clean = [c.host for c in checks if c.clean]
        if clean:
            self._notify(f"shoal | checked {', '.join(clean)}: no process of job {job_id} is left")
        for check in checks:
            for proc in check.found:
                fate = "survived SIGKILL" if proc in check.survivors else "killed"
                self._notify(f"shoal | {check.host}: {proc.task or 'a process'} pid {proc.pid} ({proc.command})"
                             f" of job {job_id} still ran after the job; {fate}")
            if check.error:
                self._notify(f"shoal | could not check {check.error}; then run shoal check {job_id}")

    def _connection(self, node: str) -> AgentConnection:
        site = self._site(node)
        argv = ssh_argv(node, site.command(agent_args(self._options.heartbeat)), self._options)
        return AgentConnection(argv, node, KIND, heartbeat=self._options.heartbeat)

    def _site(self, node: str) -> AgentSite:
        return AgentSite(node, self._python, self._workdir or str(self._cwd), tuple(self._forward.items()),
                         self._options.config)

    # --- control of recorded tasks (any process) ------------------------------------

    def alive(self, ref: TaskRef) -> bool:
        found = self._scan_host(ref)
        return any(is_member(proc, ref) for proc in found.processes)

    def kill(self, ref: TaskRef) -> None:
        job, task = dict(ref.extra).get("job"), dict(ref.extra).get("task")
        if not job:
            return
        scan([AgentSite.from_ref(ref)], job, options=self._options, kill=True, task=task)
        with self._lock:
            self._alive_cache.pop((ref.host, job), None)

    def sample(self, refs: Mapping[str, TaskRef], interval: float) -> dict[str, Usage]:
        by_job: dict[str, list[TaskRef]] = {}
        for ref in refs.values():
            job = dict(ref.extra).get("job")
            if job:
                by_job.setdefault(job, []).append(ref)
        scans: dict[str, HostScan] = {}
        for job, job_refs in by_job.items():
            scans.update(scan([AgentSite.from_ref(r) for r in job_refs], job, options=self._options,
                              usage=interval))
        out = {}
        for name, ref in refs.items():
            host = scans.get(ref.host)
            usage = None if host is None else task_usage(host, ref)
            if usage is not None:
                out[name] = usage
        return out

    def sweep(self, job_id: str, refs: Sequence[TaskRef], kill: bool) -> list[HostCheck]:
        """Every host of `refs` checked for processes of `job_id` (see executor.Sweeper)."""
        return self._sweep_sites([AgentSite.from_ref(r) for r in refs], job_id, kill)

    def _sweep_sites(self, sites: Sequence[AgentSite], job_id: str, kill: bool) -> list[HostCheck]:
        if not sites:
            return []
        return [host_check(s) for s in scan(sites, job_id, options=self._options, kill=kill).values()]

    def _scan_host(self, ref: TaskRef) -> HostScan:
        job = dict(ref.extra).get("job", "")
        key = (ref.host, job)
        with self._lock:
            cached = self._alive_cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < _ALIVE_CACHE_S:
            return cached[1]
        result = scan([AgentSite.from_ref(ref)], job, options=self._options)[ref.host] if job else HostScan(ref.host)
        with self._lock:
            self._alive_cache[key] = (time.monotonic(), result)
        return result


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _agent_of(conn: Optional[AgentConnection]) -> Optional[tuple[int, float]]:
    """(pid, create time) of `conn`'s agent on its host, for a kill; None if it never said."""
    hello = None if conn is None else conn.hello
    return (hello.pid, hello.started) if hello is not None and hello.pid and hello.started else None


def _kill_unconfirmed(conn: AgentConnection, task: str) -> None:
    """A start the agent did not confirm may still have run (a slow agent answers late): tell it
    to SIGKILL the task, so that the caller may start it elsewhere without a second copy. The
    agent reads its requests in order, so the kill follows the start; an agent whose connection
    is gone kills its tasks by itself. Best effort; does not block."""
    try:
        conn.signal(task, signal.SIGKILL)
    except AgentError:
        pass


def _held_gpus(running: Sequence[TaskPlan], node: str) -> list[str]:
    """The GPUs the running tasks on `node` hold."""
    return [g for t in running if t.node == node for g in t.gpus]
