"""Slurm as the launcher sees it: the job (allocation) tasks run in, its nodes, and the
command lines that reach them. Pure data, parsing and argv building: no I/O (the commands
run in `slurm_commands.py`); thread-safe.

A job's tasks run inside one Slurm job: the allocation `shoal` was started in (`salloc`,
`sbatch`: SLURM_JOB_ID is set) or one `shoal train --slurm` submitted. On each node that
gets tasks one host agent runs as a step of that job (`agent_step_argv`), and starts the
node's tasks; see executor_slurm.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from shoal.launch.errors import LaunchError

KIND = "slurm"
"""The executor kind the job records keep."""

AGENT_STEP_NAME = "shoal-agent"
PROBE_STEP_NAME = "shoal-probe"
_JOB_ID_RE = re.compile(r"^\d+$")
_STEP_ID_RE = re.compile(r"^\d+(\.\d+)?$")
_SUBMIT_NAME_RE = re.compile(r"^shoal-[A-Za-z0-9][A-Za-z0-9_.-]{0,62}-[0-9a-f]{8}$")


class SlurmError(LaunchError):
    """A Slurm command failed, or Slurm said something the launcher cannot use."""


@dataclass(frozen=True)
class SlurmNode:
    """One node of a job: its Slurm name, the address its tasks are reached at (Slurm's
    NodeAddr: the address Slurm itself uses for it), and the CPUs and GPUs the job holds
    there."""

    name: str
    address: str
    cpus: int = 1
    gpus: int = 0


@dataclass(frozen=True)
class SlurmJob:
    """A running Slurm job the tasks run in. `submitted`: shoal submitted it (`--slurm`), so
    shoal cancels it at the end; otherwise it is the user's allocation, and shoal cancels
    only the steps it started."""

    job_id: str
    nodes: tuple[SlurmNode, ...]
    submitted: bool = False


@dataclass(frozen=True)
class JobDetail:
    """What `scontrol -d -o show job` says of a job: its state, and per group of nodes (a
    node list expression such as `n[1-2]`) the CPUs and GPUs the job holds on each."""

    state: str
    node_groups: tuple[tuple[str, int, int], ...]
    het_job_ids: str = ""
    """The ids of a heterogeneous job's components (`HetJobIdSet`, "1-2"); "" for a plain job."""


def job_id_from_environ(environ: Mapping[str, str]) -> Optional[str]:
    """The id of the Slurm job this process runs in (SLURM_JOB_ID), None outside one.
    SlurmError if the variable is set but is not a job id."""
    value = environ.get("SLURM_JOB_ID", "").strip()
    if not value:
        return None
    if not _JOB_ID_RE.match(value):
        raise SlurmError(f"SLURM_JOB_ID={value!r} is not a Slurm job id; unset it, or run shoal"
                         " inside an allocation (salloc, sbatch)")
    return value


def check_step_id(value: str) -> str:
    """`value` if it names a Slurm job ("12") or step ("12.3"); SlurmError otherwise (the id
    comes from job records, and goes on a scancel command line)."""
    if not _STEP_ID_RE.match(value):
        raise SlurmError(f"{value!r} is not a Slurm job or step id; the job records are damaged")
    return value


def submit_name(spec_name: str, tag: str) -> str:
    """The Slurm job name of a job `--slurm` submits for job spec `spec_name`: unique by `tag`
    (8 hex digits), so the job can be found and cancelled by its name before sbatch has said
    its id. SlurmError if the result is not such a name."""
    return check_submit_name(f"shoal-{spec_name}-{tag}")


def check_submit_name(value: str) -> str:
    """`value` if it is a name `submit_name` makes ("shoal-mnist-0a1b2c3d"); SlurmError otherwise
    (it goes on scancel's and squeue's command lines)."""
    if not _SUBMIT_NAME_RE.match(value):
        raise SlurmError(f"{value!r} is not the name of a Slurm job shoal submits (shoal-NAME-8 hex digits)")
    return value


def count_ids(text: str) -> int:
    """How many ids a Slurm id list names: "0-1,4" -> 3; "" -> 0."""
    total = 0
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SlurmError(f"{text!r} is not a Slurm id list such as 0-3,6")
        total += int(high) - int(low) + 1 if high else 1
    return total


def gres_gpus(gres: str) -> int:
    """The GPUs a GRES string holds: "gpu:2(IDX:0-1)", "gpu:a100:1(IDX:3),nic:1" -> 2, 1."""
    return sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[^:(),]+)?:(\d+)", gres))


_DETAIL_RE = re.compile(r"\bNodes=(\S+) CPU_IDs=(\S*) Mem=\S* GRES=(\S*)")


def parse_job_detail(text: str, job_id: str) -> JobDetail:
    """Parse `scontrol -d -o show job JOB`; SlurmError if it is not that output."""
    state = re.search(r"\bJobState=(\S+)", text)
    if state is None or not re.search(rf"\bJobId={re.escape(job_id)}\b", text):
        raise SlurmError(f"scontrol does not describe job {job_id}: {text.strip()[:200]!r}")
    groups = tuple((nodes, count_ids(cpus), gres_gpus(gres))
                   for nodes, cpus, gres in _DETAIL_RE.findall(text))
    het = re.search(r"\bHetJobIdSet=(\S+)", text)
    return JobDetail(state.group(1), groups, het.group(1) if het else "")


def parse_node_addresses(text: str) -> dict[str, str]:
    """Node name -> NodeAddr, from `scontrol -o show node LIST` (one node per line)."""
    out = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        addr = re.search(r"\bNodeAddr=(\S+)", line)
        if name and addr:
            out[name.group(1)] = addr.group(1)
    return out


def srun_argv(job_id: str, node: str, argv: Sequence[str], *, name: str, cpus: int = 0,
              gpus: int = 0) -> list[str]:
    """`srun` running `argv` as one task of a new step of job `job_id` on `node`.

    `--overlap`: the step never waits for CPUs other steps hold (the batch script's, the
    user's own); without `--exact` the step gets every CPU the job holds on the node (and
    `cpus` asks for them for its one task, so no CPU binding narrows it); GPUs are generic
    resources a step must ask for, `gpus` of them."""
    out = ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
           "--overlap", f"--job-name={name}", "--mpi=none"]
    if cpus > 0:
        out.append(f"--cpus-per-task={cpus}")
    if gpus > 0:
        out.append(f"--gres=gpu:{gpus}")
    return [*out, *argv]


def agent_step_argv(job: SlurmJob, node: SlurmNode, python: str, gpus: int) -> list[str]:
    """The step that runs a node's host agent: every CPU the job holds there, `gpus` GPUs."""
    return srun_argv(job.job_id, node.name, [python, "-m", "shoal.launch.agent"],
                     name=AGENT_STEP_NAME, cpus=node.cpus, gpus=gpus)


def probe_step_argv(job_id: str, node: str, python: str, agent_args: Sequence[str]) -> list[str]:
    """The step that runs the host agent's one-shot mode on `node` with `agent_args`
    (`--find SHOAL_JOB_ID --usage S` for `shoal monitor`; see job_scan.py)."""
    return srun_argv(job_id, node, [python, "-m", "shoal.launch.agent", *agent_args], name=PROBE_STEP_NAME)


def step_environment(base: Mapping[str, str], *, inside: bool) -> dict[str, str]:
    """The environment `srun` runs with. Inside the user's allocation it is the launcher's
    own (srun reads the allocation's SLURM_* variables, as in any job script); for a job
    shoal submitted from outside, variables of any other job this shell is in are dropped
    (SLURM_CONF stays), so they cannot steer srun."""
    if inside:
        return dict(base)
    return {k: v for k, v in base.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
