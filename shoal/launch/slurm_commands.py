"""`SlurmCommands`: Slurm's client commands (scontrol, squeue, scancel, sbatch) as the
launcher uses them, run with a given environment (SLURM_CONF and the like come from the
CLI's edge, never from os.environ here).

Every call blocks at most `timeout` seconds and raises SlurmError naming the command and
what it printed. The constructor does no I/O; thread-safe (each call is its own process).
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Optional

from shoal.launch.parent_death import die_with_parent
from shoal.launch.slurm import (JobDetail, SlurmError, SlurmNode, check_step_id, check_submit_name,
                                parse_job_detail, parse_node_addresses)

ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"})
"""squeue's states of a job that still holds (or will hold) its nodes."""

UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Communication connection failure")
"""What Slurm's client commands say when slurmctld does not answer (slurm_watchdog.py, which
imports nothing of Shoal, keeps the same list)."""


class SlurmCommands:
    """Runs Slurm's client commands with `env` (see the module docstring)."""

    def __init__(self, env: Mapping[str, str], timeout: float = 30.0) -> None:
        self._env = dict(env)
        self._timeout = timeout

    def with_timeout(self, timeout: float) -> "SlurmCommands":
        """These commands, each bounded by `timeout` seconds instead."""
        quick = copy.copy(self)
        quick._timeout = timeout
        return quick

    def run(self, argv: Sequence[str], *, stdin: Optional[str] = None, check: bool = True,
            timeout: Optional[float] = None, with_launcher: bool = False) -> str:
        """Run `argv`; its stdout. SlurmError if it cannot run, times out, or (with `check`)
        exits non-zero. `with_launcher`: the command is killed if the launcher dies (call it
        from a thread that lives as long as the command should)."""
        done = self._completed(argv, stdin, timeout, with_launcher)
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: {said[-1] if said else 'no output'}")
        return done.stdout

    def _completed(self, argv: Sequence[str], stdin: Optional[str] = None, timeout: Optional[float] = None,
                   with_launcher: bool = False) -> subprocess.CompletedProcess:
        """`run`'s process, done, whatever its exit status. SlurmError as `run`."""
        timeout = self._timeout if timeout is None else timeout
        try:
            done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=self._env,
                                  timeout=timeout, start_new_session=True,
                                  preexec_fn=die_with_parent(os.getpid()) if with_launcher else None)
        except FileNotFoundError as e:
            raise SlurmError(f"{argv[0]} not found: run shoal where Slurm's client commands are installed"
                             " (a login or compute node of the cluster), or drop --slurm") from e
        except OSError as e:
            raise SlurmError(f"cannot run {argv[0]}: {e.strerror or e}") from e
        except subprocess.TimeoutExpired as e:
            raise SlurmError(f"{' '.join(argv)} did not finish within {timeout:g}s; is slurmctld"
                             " reachable (scontrol ping)?") from e
        return done

    def _scancel(self, args: Sequence[str]) -> None:
        """scancel --quiet ARGS. Ids that already ended are no error, whatever scancel says of
        them (--quiet still prints 'Invalid job id specified' for a step that ended, and exits
        non-zero): only a slurmctld it could not reach (UNREACHABLE) is a SlurmError."""
        argv = ["scancel", "--quiet", *args]
        said = self._completed(argv).stderr.strip().splitlines()
        unreachable = [line for line in said if any(words in line for words in UNREACHABLE)]
        if unreachable:
            raise SlurmError(f"{' '.join(argv)} failed: {unreachable[-1]}")

    def hostnames(self, nodelist: str) -> list[str]:
        """The node names a node list expression (`n[1-3],gpu7`) stands for."""
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def detail(self, job_id: str) -> JobDetail:
        """The job's state and, once it runs, its nodes' CPUs and GPUs."""
        return parse_job_detail(self.run(["scontrol", "-d", "-o", "show", "job", check_step_id(job_id)]),
                                job_id)

    def nodes(self, job_id: str) -> tuple[SlurmNode, ...]:
        """The nodes of a running job, in Slurm's order, with their addresses and the CPUs
        and GPUs the job holds on each. SlurmError if the job does not run."""
        detail = self.detail(job_id)
        if detail.het_job_ids:
            raise SlurmError(f"Slurm job {job_id} is a heterogeneous job (components {detail.het_job_ids}), which"
                             " shoal does not run in: a step of one component cannot reach the nodes of another;"
                             " allocate one component instead (salloc -N2 -n4 ..., no ':')")
        if detail.state != "RUNNING" or not detail.node_groups:
            raise SlurmError(f"Slurm job {job_id} is {detail.state}, not RUNNING: it has no nodes to run"
                             " tasks on; start shoal inside a running allocation (salloc, sbatch)")
        shares: list[tuple[str, int, int]] = []
        for expression, cpus, gpus in detail.node_groups:
            shares += [(name, cpus, gpus) for name in self.hostnames(expression)]
        expressions = ",".join(expression for expression, _, _ in detail.node_groups)
        addresses = parse_node_addresses(self.run(["scontrol", "-o", "show", "node", expressions]))
        return tuple(SlurmNode(name, addresses.get(name) or name, max(cpus, 1), gpus)
                     for name, cpus, gpus in shares)

    def state(self, job_id: str) -> Optional[str]:
        """The job's squeue state while it is active (PENDING, RUNNING, ...), None once it is
        over or unknown. SlurmError if squeue cannot tell (slurmctld unreachable)."""
        out = self._squeue(job_id, "%T").split()
        return out[0] if out else None

    def queue_state(self, job_id: str) -> Optional[tuple[str, str]]:
        """(state, reason) of the job while it is active ("PENDING", "Resources"; the reason
        is "None" once it runs), None once it is over or unknown. SlurmError as `state`."""
        lines = self._squeue(job_id, "%T %r").splitlines()
        out = lines[0].split(None, 1) if lines else []
        return (out[0], out[1].strip() if len(out) > 1 else "") if out else None

    def steps(self, job_id: str) -> set[str]:
        """The ids ("12.3") of the job's steps that still run. SlurmError as `state`."""
        return set(self._squeue(job_id, "%i", steps=True).split())

    def _squeue(self, job_id: str, fmt: str, steps: bool = False) -> str:
        """squeue's lines for an active job, "" once it is over: no longer listed, or an id
        slurmctld has forgotten ("Invalid job id"). Any other failure is a SlurmError: a
        slurmctld that cannot be reached must not read as a job that ended."""
        try:
            return self.run(["squeue", "-h", *(["-s"] if steps else []), "-j", check_step_id(job_id), "-o", fmt])
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return ""
            raise

    def cancel(self, ids: Sequence[str]) -> None:
        """scancel jobs ("12") and steps ("12.3"): Slurm TERMs their processes and KILLs them
        after its KillWait. Ids that already ended are skipped quietly; idempotent. SlurmError if
        slurmctld could not be reached."""
        ids = [check_step_id(i) for i in ids]
        if ids:
            self._scancel(ids)

    def named(self, name: str) -> list[str]:
        """Ids of the active jobs called `name` (a name `slurm.submit_name` made). SlurmError as
        `state`. Blocks (bounded by the timeout)."""
        return self.run(["squeue", "-h", f"--name={check_submit_name(name)}", "-o", "%i"]).split()

    def cancel_named(self, name: str) -> None:
        """scancel every job called `name` (a name `slurm.submit_name` made); idempotent.
        SlurmError if scancel cannot run, times out or cannot reach slurmctld. Blocks (bounded by
        the timeout)."""
        self._scancel([f"--name={check_submit_name(name)}"])

    def submit(self, argv: Sequence[str]) -> str:
        """Run `sbatch --parsable ...`; the new job's id. sbatch dies with the launcher, so
        after a launcher's death no submission is still under way a moment later."""
        out = self.run(argv, with_launcher=True).strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {out!r}, not a job id")
        return job_id
