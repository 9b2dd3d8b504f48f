"""Launch to first step under Slurm: from `shoal train` until the seed job's first training step,
with the local executor (the reference) and the Slurm executor, inside an allocation and with
`--slurm`, interleaved in every round.

The job is the seed job (examples/mnist.yaml: 2 ps + 2 workers, MNIST softmax) with
`--log_every 1`, so a worker prints `step=N loss=X` after its first step. For each way we read
the launcher's output as it arrives (bench/jobrun.py keeps each line's arrival time) and take,
from just before `shoal` is spawned:

  first task running   the first `STARTING -> RUNNING` line (the launcher got "started" back)
  all tasks running    the fourth one
  first step           the first `mnist.worker.N | ... step=` line

Ways:

  local       the local executor, 127.0.0.1 (the reference)
  allocation  inside an allocation made beforehand (`salloc --no-shell -N2 -n4`, SLURM_JOB_ID):
              one agent step per node, tasks on n1 and n2
  --slurm     `shoal train --slurm`: sbatch, waiting for the job to run, then as `allocation`;
              includes Slurm's scheduling (sched/backfill here)

Slurm: the one SLURM_CONF in the environment names, else a private two-node cluster of the
multi-host tests (tests/multihost/slurm.py: needs root, munge and slurm-wlm), started for the
run and torn down after it. Median over --repeat rounds.

    python -m bench.slurm_launch [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/slurm_launch.py`: find the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import REPO, machine, median  # noqa: E402
from bench.jobrun import Job, Launch, Output, clean_env  # noqa: E402

SPEC = f"""\
name: mnist
run: python examples/mnist_softmax.py --steps 20 --log_every 1
workdir: {REPO}
roles:
  ps: {{count: 2}}
  worker: {{count: 2}}
"""
WAYS = ("local", "allocation", "--slurm")
MARKS = ("first task running", "all tasks running", "first step")
_STEP = re.compile(r"^mnist\.worker\.\d+ \| .*\bstep=\d+ loss=")


class LaunchFailed(RuntimeError):
    """A measured launch did not succeed."""


def measure(way: str, spec: Path, env: dict[str, str], timeout_s: float) -> dict[str, float]:
    args = ["-m", "shoal.cli.main", "train", str(spec)] + (["--slurm"] if way == "--slurm" else [])
    with Job() as job:
        task = job.start(Launch(way, tuple(args), env, output=Output.CAPTURE))
        codes = job.wait(time.monotonic() + timeout_s)
        job.close()
        if codes[way] != 0:
            raise LaunchFailed(f"{way}: shoal exited {codes[way]}; its last lines:\n{task.tail()}")
        assert job.launched is not None
        running = [t for t, line in task.lines if "STARTING -> RUNNING" in line]
        steps = [t for t, line in task.lines if _STEP.match(line)]
        if len(running) < 4 or not steps:
            raise LaunchFailed(f"{way}: no 4 RUNNING lines and a step line in:\n{task.tail(40)}")
        return {"first task running": running[0] - job.launched, "all tasks running": running[3] - job.launched,
                "first step": steps[0] - job.launched}


def run_rounds(slurm_env: dict[str, str], repeat: int, timeout_s: float) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "mnist.yaml"
        spec.write_text(SPEC)
        home = {"SHOAL_HOME": f"{tmp}/home"}
        for round_ in range(repeat):
            for way in WAYS[round_ % len(WAYS):] + WAYS[:round_ % len(WAYS)]:  # interleaved
                if way == "local":
                    env = clean_env({k: v for k, v in slurm_env.items() if not k.startswith("SLURM_")}, home)
                    out[way].append(measure(way, spec, env, timeout_s))
                elif way == "--slurm":
                    out[way].append(measure(way, spec, clean_env(slurm_env, home), timeout_s))
                else:  # the allocation is made before the clock starts and ended after it stops
                    allocation = _allocate(slurm_env)
                    try:
                        env = clean_env(slurm_env, {**home, "SLURM_JOB_ID": allocation})
                        out[way].append(measure(way, spec, env, timeout_s))
                    finally:
                        _cancel(slurm_env, allocation)
    return out


def _allocate(env: dict[str, str]) -> str:
    """A user's allocation of both nodes (`salloc --no-shell`), granted; its job id."""
    granted = subprocess.run(["salloc", "--no-shell", "--nodes=2", "--ntasks=4"], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
    found = re.search(r"Granted job allocation (\d+)", granted.stderr + granted.stdout)
    if found is None:
        raise LaunchFailed(f"salloc did not say which job it granted: {granted.stderr.strip()}")
    return found.group(1)


def _cancel(env: dict[str, str], job_id: str) -> None:
    """scancel the job and wait (at most 60 s) until squeue no longer lists it."""
    subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True,
                                                         text=True, timeout=60).stdout.strip():
        time.sleep(0.2)


def slurm_environment() -> tuple[dict[str, str], object]:
    """The environment that reaches a Slurm, and the private cluster started for it (or None)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    if base.get("SLURM_CONF"):
        return base, None
    from tests.multihost import requirements
    from tests.multihost.slurm import SlurmCluster

    if reason := requirements.slurm_unavailable():
        raise SystemExit(f"no SLURM_CONF given and no private Slurm possible: {reason}")
    cluster = SlurmCluster(base_env=base)
    cluster.start()
    return cluster.env, cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=180, help="seconds one launch may take (default 180)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of everything measured")
    args = parser.parse_args()
    env, cluster = slurm_environment()
    try:
        runs = run_rounds(env, args.repeat, args.timeout)
    finally:
        if cluster is not None:
            cluster.close()
    summary = {way: {mark: median(r[mark] for r in runs[way]) for mark in MARKS} for way in WAYS}
    info = machine()
    where = "private test cluster (n1, n2 on this machine)" if cluster else env["SLURM_CONF"]
    print(f"machine: {info['cpus']} cores, load {info['loadavg_1m_at_start']}; Slurm: {where}; median of {args.repeat}")
    print(f"{'way':<11}" + "".join(f"{mark + ' ms':>22}" for mark in MARKS) + f"{'first step - local ms':>24}")
    for way in WAYS:
        extra = (summary[way]["first step"] - summary["local"]["first step"]) * 1000
        print(f"{way:<11}" + "".join(f"{summary[way][mark] * 1000:>22.0f}" for mark in MARKS) + f"{extra:>24.0f}")
    if args.json:
        print(json.dumps({"machine": info, "repeat": args.repeat, "summary_s": summary, "runs_s": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
