"""Which executor runs the job `shoal train` / `shoal run` starts: one entry per way of
running, tried in order; the first that applies builds it. (Recorded jobs are reached
through `Environment.executor(kind)`, by the kind their records name.)

| entry | applies when | runs tasks |
|---|---|---|
| slurm submission | `--slurm` | as steps of a Slurm job shoal submits (sbatch) and cancels at the end |
| slurm allocation | SLURM_JOB_ID is set (inside `salloc` / `sbatch`) | as steps of that allocation |
| local | always | as processes of this machine, on 127.0.0.1 |
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from shoal.cli.environment import Environment
from shoal.launch.executor import Executor
from shoal.launch.executor_slurm import SlurmExecutor
from shoal.launch.slurm import job_id_from_environ
from shoal.launch.slurm_allocation import CurrentAllocation
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_submit import Submission


def _slurm_submission(args: argparse.Namespace, env: Environment) -> Executor:
    commands = SlurmCommands(env.environ)
    return SlurmExecutor(commands=commands, python=env.python, base_env=env.environ,
                         source=Submission(commands, note=lambda text: env.say(text, err=True)),
                         dry_run=args.dry_run)


def _slurm_allocation(args: argparse.Namespace, env: Environment) -> Executor:
    commands = SlurmCommands(env.environ)
    job_id = job_id_from_environ(env.environ)
    assert job_id is not None
    return SlurmExecutor(commands=commands, python=env.python, base_env=env.environ,
                         source=CurrentAllocation(job_id, commands), dry_run=args.dry_run)


def _local(args: argparse.Namespace, env: Environment) -> Executor:
    return env.executor()


LAUNCH_EXECUTORS: tuple[tuple[str, Callable[[argparse.Namespace, Environment], bool],
                              Callable[[argparse.Namespace, Environment], Executor]], ...] = (
    ("slurm submission", lambda args, env: bool(getattr(args, "slurm", False)), _slurm_submission),
    ("slurm allocation", lambda args, env: job_id_from_environ(env.environ) is not None, _slurm_allocation),
    ("local", lambda args, env: True, _local),
)


def launch_executor(args: argparse.Namespace, env: Environment) -> Executor:
    """The executor for a job started now (see the table above); does no I/O."""
    for _name, applies, build in LAUNCH_EXECUTORS:
        if applies(args, env):
            return build(args, env)
    raise AssertionError("the local entry always applies")
