"""Which executor runs a job, chosen in one place: a small table of kinds.

A new job runs on Slurm when `--slurm` asks for it or shoal runs inside a Slurm allocation
(SLURM_JOB_ID set; the rows of executors_slurm.py, which refuse ssh hosts given beside them).
Otherwise it runs on the first kind whose test accepts its hosts: `local` when they are this
machine only (none given, or the one host `localhost` — exactly as before hosts existed), else
`ssh`. A recorded job is reached through the kind its records name (`RECORDED`). A new executor
adds one row to each table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.cli.executors_slurm import slurm_launcher, slurm_recorded
from shoal.launch.agent import shoal_version
from shoal.launch.errors import LaunchError, SpecError
from shoal.launch.executor import Executor
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.executor_ssh import SshExecutor
from shoal.launch.fingerprint import code_fingerprint
from shoal.launch.hosts import Host, is_local, parse_hostfile, parse_hosts_flag
from shoal.launch.slurm import KIND as SLURM_KIND
from shoal.launch.spec import JobSpec
from shoal.launch.ssh import SshOptions

if TYPE_CHECKING:
    from shoal.cli.environment import Environment

FORWARDED_PREFIXES = ("PYTHON",)
"""The launcher's variables that tasks on other hosts get too (PYTHONPATH, ...), as DeepSpeed's
runner does; anything else goes under env: in the spec."""


def add_host_flags(parser: argparse.ArgumentParser) -> None:
    """--hosts / --hostfile / --slurm (one of them) and --ssh-config, for `shoal train` and `shoal run`."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="A,B,C", help="run on these hosts (ssh destinations; host:N for N slots)")
    where.add_argument("--hostfile", metavar="FILE", help="run on the hosts of FILE (lines `host slots=N`)")
    where.add_argument("--slurm", action="store_true",
                       help="submit a Slurm job sized for the spec (sbatch) and run the tasks in it;"
                       " inside an allocation (SLURM_JOB_ID set) tasks run in it without this flag")
    parser.add_argument("--ssh-config", metavar="FILE", help="ssh -F FILE for the hosts (default: ~/.ssh/config)")


def job_hosts(spec: JobSpec, args: argparse.Namespace, env: "Environment") -> tuple[Host, ...]:
    """The job's hosts: --hosts, else --hostfile, else the spec's hosts: (none: this machine)."""
    if getattr(args, "hosts", None):
        return parse_hosts_flag(args.hosts)
    if getattr(args, "hostfile", None):
        path = env.cwd / args.hostfile
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise SpecError(f"cannot read the hostfile: {e.strerror}; check the path", source=args.hostfile) from e
        return parse_hostfile(text, args.hostfile)
    return spec.host_list()


def _local(spec: JobSpec, hosts: tuple[Host, ...], args: argparse.Namespace, env: "Environment") -> Executor:
    return LocalExecutor(python=env.python, base_env=env.environ, notify=lambda text: env.say(text, err=True))


def _ssh(spec: JobSpec, hosts: tuple[Host, ...], args: argparse.Namespace, env: "Environment") -> Executor:
    config = getattr(args, "ssh_config", None) or spec.ssh.config
    if config:
        config = str((env.cwd / Path(config).expanduser()).resolve())
    options = SshOptions(config=config, connect_timeout=spec.ssh.connect_timeout,
                         heartbeat=spec.ssh.heartbeat_timeout)
    return SshExecutor(hosts, python=spec.ssh.python or env.python, cwd=env.cwd, options=options,
                       forward_env=forwarded(env.environ), version=shoal_version(),
                       fingerprint=code_fingerprint(),
                       notify=lambda line: env.say(line))


Chooser = Callable[[JobSpec, tuple[Host, ...], argparse.Namespace, "Environment"], Executor]

LAUNCHERS: tuple[tuple[str, Callable[[tuple[Host, ...]], bool], Chooser], ...] = (
    ("local", is_local, _local),
    ("ssh", lambda hosts: True, _ssh),
)
"""(kind, does it take a job on these hosts, make it): the first that takes the job runs it."""

RECORDED: dict[str, Callable[["Environment"], Executor]] = {
    LocalExecutor.kind: lambda env: LocalExecutor(python=env.python, base_env=env.environ),
    SshExecutor.kind: lambda env: SshExecutor(python=env.python, cwd=env.cwd),
    SLURM_KIND: slurm_recorded,
}
"""kind -> an executor that controls recorded tasks of that kind (TaskRefs say the rest)."""


def executor_for(spec: JobSpec, args: argparse.Namespace, env: "Environment") -> Executor:
    """The executor that runs `spec` now, as flags, spec and environment place it: Slurm first
    (PlanError if ssh hosts are given beside it), then the LAUNCHERS table."""
    hosts = job_hosts(spec, args, env)
    slurm = slurm_launcher(args, env, hosts)
    if slurm is not None:
        return slurm
    for _kind, takes, make in LAUNCHERS:
        if takes(hosts):
            return make(spec, hosts, args, env)
    raise LaunchError("no executor takes this job")  # the last row takes every job


def recorded_executor(kind: str, env: "Environment") -> Executor:
    """An executor of `kind` for tasks a recorded job names; LaunchError for an unknown kind."""
    make = RECORDED.get(kind)
    if make is None:
        raise LaunchError(
            f"the job ran on the {kind!r} executor, which this shoal does not know (it knows"
            f" {', '.join(map(repr, RECORDED))}); use the shoal that started the job"
        )
    return make(env)


def forwarded(environ: dict[str, str] | object) -> dict[str, str]:
    """The launcher's variables passed on to tasks on other hosts."""
    return {k: v for k, v in dict(environ).items() if k.startswith(FORWARDED_PREFIXES)}  # type: ignore[call-overload]
