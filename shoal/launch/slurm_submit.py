"""`shoal train --slurm` outside an allocation: `Submission` submits a Slurm job sized from
the spec (`sbatch_argv`), waits until it runs, and cancels it when the shoal job ends.

The submitted job only holds the nodes: its batch script sleeps, and the launcher — which
stays on the machine `shoal` was started on, as `salloc` does — runs the tasks in it as
steps, exactly as inside an allocation. So the job records, `shoal status`, `logs`, `kill`
and `monitor` work from another terminal of that machine as for any job, and the job never
outlives the launcher: teardown scancels it, and so does the Slurm watchdog if the launcher
dies. That holds from the moment sbatch runs, before it has said the job's id (a busy
slurmctld answers seconds late): the job's name is unique (`shoal-NAME-TAG`, TAG 8 random hex
digits) and the watchdog holds it until the id is known, so a launcher killed meanwhile, or
stopped by Ctrl-C or SIGTERM, still has the job cancelled, by its name. Its time limit
(`--time`) is the spec's deadline plus the grace period and a margin, so it cannot linger
beyond that either.

Sizing: `--ntasks` is the number of tasks; every task slot gets the largest role's
`cpus` (`--cpus-per-task`, at least 1), `memory` (`--mem-per-cpu`) and `gpus`
(`--gpus-per-task`). sbatch's own variables (SBATCH_PARTITION, SBATCH_ACCOUNT,
SBATCH_TIMELIMIT, ...) apply as for any sbatch.

Blocking (bounded Slurm commands; the wait for the job to start only by `queue_timeout`);
not thread-safe: one job, from one thread.
"""

from __future__ import annotations

import functools
import math
import secrets
import shlex
import time
from collections.abc import Callable
from typing import Optional

from shoal.launch.allocation import task_ids
from shoal.launch.errors import PlanError
from shoal.launch.slurm import SlurmError, SlurmJob, SlurmNode, submit_name
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_reaper import SlurmReaper
from shoal.launch.spec import JobSpec

HOLD_SCRIPT = "exec sleep infinity"
"""The batch script: it only holds the nodes; the launcher runs the tasks as steps."""

NEVER_STARTS = {
    "PartitionConfig": "it asks for more than the partition's nodes have (CPUs, memory or GPUs per node)",
    "PartitionTimeLimit": "its time limit is over the partition's (the spec's deadline sets it)",
    "BadConstraints": "no node of the partition meets its constraints",
    "InvalidAccount": "its account is not valid (SBATCH_ACCOUNT)",
    "InvalidQOS": "its QOS is not valid (SBATCH_QOS)",
}
"""Pending reasons (squeue's %r) that do not clear by waiting (only an administrator's change
clears them): a job held by one for NEVER_STARTS_AFTER_S is cancelled. Not PartitionNodeLimit,
which also stands for nodes that are down or drained for now."""

NEVER_STARTS_AFTER_S = 3.0

_TIME_MARGIN_S = 120.0
_POLL_S = 0.2
_GONE_WAIT_S = 30.0
_UNANSWERED_S = 30.0
_MIB = 1 << 20


def sbatch_argv(spec: JobSpec, name: str) -> list[str]:
    """The sbatch command that submits a job big enough for every task of `spec`, called
    `name` (see the module docstring), on the nodes its roles pin tasks to. No secret and
    nothing from the spec's env: only sizes, nodes and the name. PlanError if the roles pin
    tasks to more nodes than the job has tasks."""
    roles = [spec.role(t.job) for t in task_ids(spec)]
    cpus = max(math.ceil(r.cpus or 1) for r in roles)
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--ntasks={len(roles)}",
            f"--cpus-per-task={cpus}", "--output=/dev/null"]
    memory = max((int(r.memory) for r in roles if r.memory), default=0)
    if memory:
        argv.append(f"--mem-per-cpu={max(1, math.ceil(memory / cpus / _MIB))}M")
    gpus = max(r.gpus for r in roles)
    if gpus:
        argv.append(f"--gpus-per-task={gpus}")
    if spec.deadline:
        argv.append(f"--time={math.ceil((spec.deadline + spec.grace_period + _TIME_MARGIN_S) / 60)}")
    pinned = _pinned_nodes(spec)
    if len(pinned) > len(roles):  # sbatch would set nnodes to the tasks' count: a job that never starts
        raise PlanError(f"the roles' hosts: name {len(pinned)} nodes ({', '.join(pinned)}) for {len(roles)} tasks;"
                        " with --slurm shoal asks Slurm for every node they name (sbatch --nodelist), and Slurm"
                        f" puts a task on each: name at most {len(roles)}, or run in an allocation of your own"
                        " (salloc -w NODE,... shoal train ...)")
    if pinned:  # the job holds these (and others, as its tasks need)
        argv.append(f"--nodelist={','.join(pinned)}")
    return [*argv, f"--wrap={HOLD_SCRIPT}"]


def _pinned_nodes(spec: JobSpec) -> list[str]:
    """The nodes the spec's roles pin tasks to (`hosts:`), sorted."""
    return sorted({node for nodes in spec.pinned_hosts().values() for node in nodes})


class Submission:
    """A job shoal submits for one shoal job (a SlurmJobSource). `note` is told, in words,
    what happens while the job waits in the queue. The constructor does no I/O."""

    def __init__(self, commands: SlurmCommands, *, note: Callable[[str], None] = lambda text: None,
                 queue_timeout: Optional[float] = None) -> None:
        self._commands = commands
        self._note = note
        self._queue_timeout = queue_timeout
        self._job_id: Optional[str] = None
        self._name: Optional[str] = None  # the job's name while its id is not known
        self._started = False
        self._listener: Callable[[str], None] = lambda text: None

    def watch_queue(self, listener: Callable[[str], None]) -> bool:
        self._listener = listener
        return True

    def acquire(self, spec: JobSpec, reaper: SlurmReaper) -> SlurmJob:
        if self._job_id is not None or self._name is not None:
            raise SlurmError(f"Submission.acquire called twice (job {self._job_id or self._name} is submitted already)")
        name = submit_name(spec.name, secrets.token_hex(4))
        argv = sbatch_argv(spec, name)  # (PlanError before anything is registered)
        reaper.add_name(name)  # before sbatch runs: the job may be there long before its id
        self._name = name
        job_id = self._commands.submit(argv)
        self._job_id = job_id
        reaper.add(job_id)
        reaper.remove_name(name)
        self._name = None
        self._note(f"shoal | submitted Slurm job {job_id}; waiting for it to start (Ctrl-C cancels it)")
        self._listener(f"Slurm job {job_id} is submitted")
        self._wait_running(job_id)
        self._started = True
        return SlurmJob(job_id, self._commands.nodes(job_id), submitted=True)

    def preview(self, spec: JobSpec) -> tuple[SlurmJob, str]:
        roles = [spec.role(t.job) for t in task_ids(spec)]
        cpus, gpus = max(math.ceil(r.cpus or 1) for r in roles), sum(r.gpus for r in roles)
        nodes = [SlurmNode(name, name, cpus, gpus) for name in [*_pinned_nodes(spec), "NODE"]]
        job = SlurmJob("0", tuple(nodes), submitted=True)
        return job, (f"# submitted with: {shlex.join(sbatch_argv(spec, f'shoal-{spec.name}-TAG'))}\n"
                     "# (TAG: 8 random hex digits, new for each submission)\n"
                     "# nodes and ports are known once the job runs (shown as NODE:0); the tasks"
                     " run as steps of it, one agent step per node\n")

    def release(self, reaper: Optional[SlurmReaper]) -> None:
        job_id, self._job_id = self._job_id, None
        name, self._name = self._name, None
        if job_id is None and name is not None:  # stopped while sbatch ran: it may have submitted the job
            self._release_named(name, reaper)
            return
        if job_id is None:
            return
        if reaper is not None and name is not None:  # stopped as the id was being registered
            reaper.remove_name(name)
        try:
            self._commands.cancel([job_id])
        except SlurmError as e:
            self._note(f"shoal | could not cancel Slurm job {job_id} ({e}); the launcher's Slurm watchdog tries"
                       f" again as it exits (else: scancel {job_id})")
            return  # left registered: the watchdog scancels it when the reaper closes
        if not self._started:  # the launcher's own lines say how a running job ended
            self._note(f"shoal | cancelled Slurm job {job_id} before it started")
        if self._wait_gone(job_id, lambda: self._commands.state(job_id) is None) and reaper is not None:
            reaper.remove(job_id)  # else the watchdog scancels it once more

    def _release_named(self, name: str, reaper: Optional[SlurmReaper]) -> None:
        """Cancel the job called `name` that sbatch was submitting when the launcher was stopped
        (before it said the job's id; there may be none), again at each poll: slurmctld may
        create it a moment later. Blocks up to _GONE_WAIT_S."""
        try:
            found = self._commands.named(name)
        except SlurmError:
            found = []  # cancel by name all the same
        gone = self._wait_gone(name, lambda: not self._commands.named(name),
                               functools.partial(self._commands.cancel_named, name))
        if found:
            self._note(f"shoal | cancelled Slurm job {', '.join(found)} before it started")
        if reaper is not None and gone:
            reaper.remove_name(name)  # else the watchdog cancels by the name once more

    def _wait_gone(self, what: str, gone: Callable[[], bool], cancel: Optional[Callable[[], None]] = None) -> bool:
        """Poll `gone` up to _GONE_WAIT_S, calling `cancel` before each poll when given; whether
        it came true. Says so if Slurm cannot tell. Blocks."""
        deadline = time.monotonic() + _GONE_WAIT_S
        try:
            while True:
                if cancel is not None:
                    cancel()
                if gone():
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_POLL_S)
        except SlurmError as e:  # left registered: the watchdog tries again when the reaper closes
            self._note(f"shoal | could not confirm that Slurm job {what} ended: {e}")
            return False

    def _wait_running(self, job_id: str) -> None:
        """Block until the job runs; say each new state and pending reason. SlurmError (the
        caller cancels the job) if it ended first, waits for a reason that never clears
        (NEVER_STARTS), or is still queued after `queue_timeout`."""
        deadline = None if self._queue_timeout is None else time.monotonic() + self._queue_timeout
        said = None
        unanswered_since: Optional[float] = None
        never: Optional[float] = None  # since when it waits for a reason that never clears
        while True:
            try:
                queued = self._commands.queue_state(job_id)
                unanswered_since = None
            except SlurmError:  # slurmctld busy or restarting: ask again, for a while
                unanswered_since = unanswered_since or time.monotonic()
                if time.monotonic() - unanswered_since > _UNANSWERED_S:
                    raise
                time.sleep(_POLL_S)
                continue
            state, reason = queued if queued is not None else (None, "")
            if state == "RUNNING":
                return
            if state is None or state not in ("PENDING", "CONFIGURING"):
                raise SlurmError(f"Slurm job {job_id} ended before it ran ({state or 'gone'}); see"
                                 f" scontrol show job {job_id} and the partition's limits (sinfo)")
            if reason not in NEVER_STARTS:
                never = None
            elif never is None:
                never = time.monotonic()
            if never is not None and time.monotonic() - never >= NEVER_STARTS_AFTER_S:
                raise SlurmError(f"Slurm job {job_id} can never start: it is {state} for {reason}:"
                                 f" {NEVER_STARTS[reason]}; it is cancelled. Ask for less in the spec's roles"
                                 " (cpus, memory, gpus, deadline) or another partition (SBATCH_PARTITION);"
                                 f" sinfo -o '%P %D %c %m %G %l' shows what each partition holds")
            if (state, reason) != said:
                why = f" ({reason})" if reason and reason != "None" else ""
                self._note(f"shoal | Slurm job {job_id} is {state}{why}")
                self._listener(f"Slurm job {job_id} is {state}{why}")
                said = (state, reason)
            if deadline is not None and time.monotonic() > deadline:
                raise SlurmError(f"Slurm job {job_id} did not start within {self._queue_timeout:g}s"
                                 " (it is cancelled); ask for fewer resources or try later")
            time.sleep(_POLL_S)
