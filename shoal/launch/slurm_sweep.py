"""`sweep_slurm`: `shoal check` (and the sweep after `shoal kill`) for a job whose tasks ran
as steps of a Slurm job.

Per Slurm job the tasks ran in: while it is still active (the user's `salloc`, say), every
node that ran a task is asked, by a probe step (`srun --overlap ... python -m
shoal.launch.agent --find SHOAL_JOB_ID [--kill]`, as `shoal monitor` measures), for the
processes of the shoal job there — found by the `SHOAL_JOB_ID` in their environment, so
also those that left their process group — and, with `kill`, SIGKILLs them; the agent steps
recorded for the job that Slurm still lists are cancelled too. Once the Slurm job is over,
Slurm has ended every process of its steps, and no step can run there any more: each node is
reported clean with that said (`HostCheck.note`). So is a job that is COMPLETING (Slurm is
ending its processes; no step can start in it) or requeued (PROBED_STATES says which states are
probed), and one that ended while its nodes were probed:
an allocation that lives as long as its launcher (`salloc ... shoal train`) ends right after
`shoal kill` stops the launcher, and Slurm then terminates the probe steps too.

Blocks: bounded Slurm commands and one probe step per node, all nodes at once; thread-safe.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from shoal.launch.executor import HostCheck, TaskRef
from shoal.launch.job_scan import find_args, host_check, read_report
from shoal.launch.slurm import SlurmError, probe_step_argv, step_environment
from shoal.launch.slurm_commands import SlurmCommands

PROBE_TIMEOUT_S = 30.0


def sweep_slurm(commands: SlurmCommands, python: str, base_env: Mapping[str, str], shoal_job: str,
                refs: Sequence[TaskRef], kill: bool) -> list[HostCheck]:
    """One HostCheck per (Slurm job, node) that ran tasks of `shoal_job` (see the module
    docstring)."""
    nodes: dict[str, set[str]] = {}  # Slurm job -> its nodes that ran tasks
    steps: dict[str, set[str]] = {}  # Slurm job -> the agent steps recorded
    for ref in refs:
        extra = dict(ref.extra)
        job = extra.get("job", "")
        if job and ref.host:
            nodes.setdefault(job, set()).add(ref.host)
            if extra.get("step"):
                steps.setdefault(job, set()).add(extra["step"])
    probes: list[tuple[str, str]] = []
    checks: list[HostCheck] = []
    for job, on in nodes.items():
        try:
            state = commands.state(job)
            if _probed(state) and kill:
                commands.cancel(sorted(steps.get(job, set()) & commands.steps(job)))
        except SlurmError as e:
            checks += [HostCheck(node, error=f"{node}: {e}") for node in sorted(on)]
            continue
        if _probed(state):
            probes += [(job, node) for node in sorted(on)]
        else:
            checks += [_over(job, node, state) for node in sorted(on)]
    if probes:
        with ThreadPoolExecutor(max_workers=len(probes)) as pool:
            probed = list(pool.map(lambda p: _probe(python, base_env, shoal_job, *p, kill), probes))
        states: dict[str, Optional[str]] = {}  # per job of a failed probe: its state, asked again
        untold: set[str] = set()  # ... where squeue could not tell: the probe's error stands
        for (job, node), check in zip(probes, probed):
            if check.error and job not in states and job not in untold:
                try:
                    states[job] = commands.state(job)  # it may have ended meanwhile
                except SlurmError:
                    untold.add(job)
            if check.error and job in states and not _probed(states[job]):
                check = _over(job, node, states[job])
            checks.append(check)
    return checks


PROBED_STATES = ("RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING")
"""squeue's states of a Slurm job whose steps' processes may still run, so a probe step looks
for the job's processes on its nodes. In the other active states Slurm has ended them or is
ending them: COMPLETING and STAGE_OUT (the job is ending), PENDING and the REQUEUE states (a
requeued job waits to run again), CONFIGURING (its nodes are booting: nothing ran yet)."""


def _probed(state: Optional[str]) -> bool:
    """Whether the nodes of a Slurm job in `state` (squeue's; None: over) are probed."""
    return state in PROBED_STATES


def _over(job: str, node: str, state: Optional[str]) -> HostCheck:
    """`node` reported clean, since Slurm job `job` (in squeue's `state`, None: over) ends or
    ended every process of its steps."""
    if state in ("COMPLETING", "STAGE_OUT"):
        return HostCheck(node, note=f"Slurm job {job} is completing: Slurm is ending every process of its steps")
    if state is not None:
        return HostCheck(node, note=f"Slurm job {job} is {state}: Slurm ended every process of its steps")
    return HostCheck(node, note=f"Slurm job {job} is over: Slurm ended every process of its steps")


def _probe(python: str, base_env: Mapping[str, str], shoal_job: str, job: str, node: str, kill: bool) -> HostCheck:
    argv = probe_step_argv(job, node, python, find_args(shoal_job, kill=kill))
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              env=step_environment(base_env, inside=False), timeout=PROBE_TIMEOUT_S,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return HostCheck(node, error=f"{node}: the probe step in Slurm job {job} did not answer within"
                                     f" {PROBE_TIMEOUT_S:g}s; see squeue -s -j {job}")
    except OSError as e:
        return HostCheck(node, error=f"{node}: cannot run srun: {e.strerror or e}")
    scan = read_report(node, done.stdout) if done.returncode == 0 else None
    if scan is None:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return HostCheck(node, error=f"{node}: the probe step in Slurm job {job} failed"
                                     f" ({said[-1] if said else f'exit {done.returncode}'})")
    return host_check(scan)
