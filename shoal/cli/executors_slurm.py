"""The Slurm rows of the executor choice: which Slurm executor runs a job started now
(`slurm_launcher`), and the one that reaches a recorded Slurm job's tasks (`slurm_recorded`).

| applies when | executor |
|---|---|
| `--slurm` | Slurm: submits a job sized for the spec (sbatch), runs the tasks as its steps, cancels it at the end |
| SLURM_JOB_ID is set (inside `salloc` / `sbatch`) | Slurm: the tasks run as steps of that allocation |
| neither | not Slurm (`slurm_launcher` returns None): the other executors choose |

Does no I/O (the executors do theirs later).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from shoal.launch.executor import Executor
from shoal.launch.executor_slurm import SlurmExecutor
from shoal.launch.slurm import job_id_from_environ
from shoal.launch.slurm_allocation import CurrentAllocation, SlurmJobSource
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_submit import Submission

if TYPE_CHECKING:
    from shoal.cli.environment import Environment


def slurm_launcher(args: argparse.Namespace, env: "Environment") -> Optional[Executor]:
    """The Slurm executor for a job started now (see the table above), or None."""
    commands = SlurmCommands(env.environ)
    source: SlurmJobSource
    if getattr(args, "slurm", False):
        source = Submission(commands, note=lambda text: env.say(text, err=True))
    else:
        job_id = job_id_from_environ(env.environ)
        if job_id is None:
            return None
        source = CurrentAllocation(job_id, commands)
    return SlurmExecutor(commands=commands, python=env.python, base_env=env.environ, source=source,
                         dry_run=bool(getattr(args, "dry_run", False)))


def slurm_recorded(env: "Environment") -> Executor:
    """A Slurm executor that controls recorded tasks (their TaskRefs name job, step and node)."""
    return SlurmExecutor(commands=SlurmCommands(env.environ), python=env.python, base_env=env.environ)
