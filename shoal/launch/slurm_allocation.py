"""Where a Slurm job's tasks get their nodes: `SlurmJobSource`, and `CurrentAllocation`, the
allocation shoal was started in (`salloc`, `sbatch`: SLURM_JOB_ID). The other source,
`slurm_submit.Submission`, submits a job of its own (`--slurm`).

Blocking (Slurm commands, bounded); not thread-safe: one job, from one thread.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from shoal.launch.slurm import SlurmJob, SlurmNode
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_reaper import SlurmReaper
from shoal.launch.spec import JobSpec
from shoal.wording import counted


class SlurmJobSource(Protocol):
    """Provides the running Slurm job a shoal job's tasks run in."""

    def acquire(self, spec: JobSpec, reaper: SlurmReaper) -> SlurmJob:
        """The running job for `spec` (submitting one if this source does: `reaper` holds its
        name before sbatch runs, and its id as soon as sbatch says it). Blocks until it runs;
        SlurmError if it cannot."""
        ...

    def preview(self, spec: JobSpec) -> tuple[SlurmJob, str]:
        """For a dry run, without side effects: the job `acquire` would give as far as it is
        known now, and lines saying what `acquire` would do."""
        ...

    def release(self, reaper: Optional[SlurmReaper]) -> None:
        """End what `acquire` submitted, even if it was stopped before sbatch said the job's
        id (nothing for an allocation shoal runs in), and take it off `reaper`; idempotent."""
        ...

    def watch_queue(self, listener: Callable[[str], None]) -> bool:
        """Before `acquire`: tell `listener` each new state of a submitted job while it waits
        in the queue, in words; returns whether this source submits one (an allocation shoal
        runs in never waits: False). No I/O."""
        ...


class CurrentAllocation:
    """The allocation shoal runs in. The constructor does no I/O."""

    def __init__(self, job_id: str, commands: SlurmCommands) -> None:
        self._job_id = job_id
        self._commands = commands

    def acquire(self, spec: JobSpec, reaper: SlurmReaper) -> SlurmJob:
        return SlurmJob(self._job_id, self._commands.nodes(self._job_id), submitted=False)

    def preview(self, spec: JobSpec) -> tuple[SlurmJob, str]:
        job = SlurmJob(self._job_id, self._commands.nodes(self._job_id), submitted=False)
        nodes = ", ".join(f"{n.name} ({', '.join(_held(n))})" for n in job.nodes)
        return job, (f"# Slurm job {job.job_id} (the allocation shoal runs in): {nodes}\n"
                     "# one agent step per node that gets tasks; each agent picks its tasks' ports"
                     " when the job starts (shown as port 0)\n")

    def release(self, reaper: Optional[SlurmReaper]) -> None:
        return None

    def watch_queue(self, listener: Callable[[str], None]) -> bool:
        return False


def _held(node: SlurmNode) -> list[str]:
    """E.g. ["127.0.0.1", "1 CPU", "2 GPUs"]: a node's address and what the job holds there."""
    held = [node.address, counted(node.cpus, "CPU")]
    if node.gpus:
        held.append(counted(node.gpus, "GPU"))
    return held
