"""`shoal status [JOB] [--json]`: the recorded jobs (newest first), or one job's tasks."""

from __future__ import annotations

import argparse
import json
import time

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.launch.control import reconcile
from shoal.launch.records import JobRecord
from shoal.launch.root_cause import load_root_cause
from shoal.launch.states import JobState, TaskState


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("status", help="list jobs, or show one job's tasks")
    parser.add_argument("job", nargs="?", help="job id, id prefix or name (newest)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of jobs, newest first, with their tasks")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        jobs = [store.find(args.job)] if args.job else store.list_jobs()
        jobs = [reconcile(store, job, env.executor(job.executor)) for job in jobs]
    if args.json:
        env.say(json.dumps([with_root_cause(job.as_json(), job) for job in jobs], indent=2))
    elif args.job:
        env.say(job_table(jobs[0]))
        cause = load_root_cause(jobs[0].job_dir) if jobs[0].state is JobState.FAILED else None
        if cause is not None:
            env.say(cause.format())
    else:
        env.say(jobs_table(jobs))
    return int(ExitCode.OK)


def with_root_cause(data: dict, job: JobRecord) -> dict:
    """A job's JSON, with its root cause (shoal/launch/root_cause.py) if it failed and one was kept."""
    cause = load_root_cause(job.job_dir) if job.state is JobState.FAILED else None
    return {**data, "root_cause": cause.as_json()} if cause is not None else data


def jobs_table(jobs: list[JobRecord]) -> str:
    rows = [("ID", "NAME", "STATE", "TASKS", "STEP", "LOSS", "STARTED")]
    for job in jobs:
        running = sum(t.state is TaskState.RUNNING for t in job.tasks)
        rows.append((
            job.id, job.name, job.state.value, f"{running}/{len(job.tasks)} running",
            "" if job.step is None else str(job.step),
            "" if job.loss is None else f"{job.loss:.4g}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.created)),
        ))
    return table(rows) if jobs else "no jobs yet; start one with shoal train SPEC.yaml"


def job_table(job: JobRecord) -> str:
    head = f"job {job.id}  {job.state.value}"
    if job.reason:
        head += f" ({job.reason})"
    if job.exit_code is not None:
        head += f"  exit {job.exit_code}"
    rows = [("TASK", "STATE", "PID", "RESTARTS", "ADDRESS", "DETAIL")]
    for t in job.tasks:
        rows.append((t.label, t.state.value, str(t.pid or ""), str(t.restarts), t.address, t.detail))
    return f"{head}\nlogs: {job.job_dir}/logs   model dir: {job.model_dir}\n{table(rows)}"


def table(rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns separated by two spaces; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)
