"""The Slurm rows of the executor choice: which Slurm executor runs a job started now
(`slurm_launcher`), and the one that reaches a recorded Slurm job's tasks (`slurm_recorded`).

| applies when | executor |
|---|---|
| `--slurm` | Slurm: submits a job sized for the spec (sbatch), runs the tasks as its steps, cancels it at the end |
| SLURM_JOB_ID is set (inside `salloc` / `sbatch`) | Slurm: the tasks run as steps of that allocation |
| neither | not Slurm (`slurm_launcher` returns None): the other executors choose |

Under Slurm the tasks run on the Slurm job's nodes, so ssh hosts given as well (`--hosts`,
`--hostfile`, the spec's `hosts:`) are refused (PlanError, exit 4) rather than ignored; the
message says how to get either. A role's `hosts:` may still pin tasks to Slurm nodes.

Does no I/O (the executors do theirs later).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from shoal.launch.errors import PlanError
from shoal.launch.executor import Executor
from shoal.launch.executor_slurm import SlurmExecutor
from shoal.launch.hosts import Host
from shoal.launch.slurm import job_id_from_environ
from shoal.launch.slurm_allocation import CurrentAllocation, SlurmJobSource
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_submit import Submission

if TYPE_CHECKING:
    from shoal.cli.environment import Environment


def slurm_launcher(args: argparse.Namespace, env: "Environment", hosts: Sequence[Host] = ()) -> Optional[Executor]:
    """The Slurm executor for a job started now (see the table above), or None. `hosts`: the
    ssh hosts the flags or the spec give; PlanError if there are any and Slurm applies."""
    commands = SlurmCommands(env.environ)
    source: SlurmJobSource
    if getattr(args, "slurm", False):
        _refuse_hosts(hosts, args, "--slurm runs the tasks in a Slurm job it submits",
                      "to run them over ssh, drop --slurm")
        source = Submission(commands, note=lambda text: env.say(text, err=True))
    else:
        job_id = job_id_from_environ(env.environ)
        if job_id is None:
            return None
        _refuse_hosts(hosts, args, f"shoal runs inside Slurm job {job_id} (SLURM_JOB_ID), whose nodes run the tasks",
                      "to run them over ssh instead, start shoal outside the allocation"
                      " (or with `env -u SLURM_JOB_ID shoal ...`)")
        source = CurrentAllocation(job_id, commands)
    return SlurmExecutor(commands=commands, python=env.python, base_env=env.environ, source=source,
                         dry_run=bool(getattr(args, "dry_run", False)), notify=lambda text: env.say(text, err=True))


def slurm_recorded(env: "Environment") -> Executor:
    """A Slurm executor that controls recorded tasks (their TaskRefs name job, step and node)."""
    return SlurmExecutor(commands=SlurmCommands(env.environ), python=env.python, base_env=env.environ)


def _refuse_hosts(hosts: Sequence[Host], args: argparse.Namespace, why: str, other_way: str) -> None:
    if not hosts:
        return
    names = ", ".join(h.name for h in hosts)
    if getattr(args, "hosts", None):
        given, drop = f"--hosts names {names}", "drop --hosts"
    elif getattr(args, "hostfile", None):
        given, drop = f"--hostfile {args.hostfile} names {names}", "drop --hostfile"
    else:
        given, drop = (f"the spec lists hosts: ({names})",
                       "remove the spec's top-level hosts: (a role's hosts: may name Slurm nodes)")
    raise PlanError(f"{why}, but {given}; to run on Slurm, {drop}; {other_way}")
