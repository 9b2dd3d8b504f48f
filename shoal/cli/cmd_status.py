"""`shoal status [JOB] [--running | --all | --last N] [--json]`: the recorded jobs (newest
first; by default the RECENT newest and every job still running), or one job's tasks.

A job whose launcher died is reconciled first (control.reconcile_jobs); one whose executor
cannot be asked (a hung slurmctld) is listed as recorded, with a line saying why (`unchecked`
in the JSON), and the command still exits 0."""

from __future__ import annotations

import argparse
import json
import time

from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import JOB_HELP
from shoal.launch.control import reconcile_jobs
from shoal.launch.job_refs import find_job
from shoal.launch.records import JobRecord, TaskRecord
from shoal.launch.root_cause import load_root_cause
from shoal.launch.states import JobState, running_of
from shoal.launch.stragglers import figures

RECENT = 10
"""How many of the newest jobs `shoal status` lists by default (running ones always)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("status", help="list jobs, or show one job's tasks")
    parser.add_argument("job", nargs="?", metavar="JOB", help=f"{JOB_HELP}: show its tasks")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--running", action="store_true", help="only the jobs still running")
    which.add_argument("--all", action="store_true", help="every recorded job")
    which.add_argument("--last", type=_positive, metavar="N", help="the N newest jobs")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of jobs, newest first, with their tasks")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    if args.job and (args.running or args.all or args.last):
        chosen = "--running" if args.running else "--all" if args.all else f"--last {args.last}"
        raise UsageError(f"{chosen} chooses which jobs to list, and {args.job} names one job to show;"
                         f" drop {chosen.split()[0]} (shoal status {args.job}) or the job (shoal status {chosen})")
    with env.store() as store:
        listed = [find_job(store, args.job)] if args.job else store.list_jobs()
        reconciled = reconcile_jobs(store, listed, env.executor)
    jobs = [r.job for r in reconciled]
    unchecked = {r.job.id: r.unchecked for r in reconciled if r.unchecked}
    hidden = 0
    if not args.job:
        shown = select(jobs, running=args.running, every=args.all, last=args.last)
        jobs, hidden = shown, len(jobs) - len(shown)
    if args.json:
        env.say(json.dumps([with_unchecked(with_root_cause(with_figures(job.as_json(), job), job), unchecked)
                            for job in jobs], indent=2))
        return int(ExitCode.OK)
    if args.job:
        env.say(job_table(jobs[0]))
        cause = load_root_cause(jobs[0].job_dir) if jobs[0].state is JobState.FAILED else None
        if cause is not None:
            env.say(cause.format())
    else:
        env.say(jobs_table(jobs, running_only=args.running))
        if hidden and not args.running:  # --running asked for running jobs only
            env.say(f"{hidden} older finished jobs not shown: shoal status --all or --last N"
                    " (shoal prune removes finished jobs)")
    for job in jobs:
        if job.id in unchecked:
            env.say(f"job {job.id} is shown as recorded: {unchecked[job.id]}")
    return int(ExitCode.OK)


def select(jobs: list[JobRecord], *, running: bool = False, every: bool = False,
           last: "int | None" = None) -> list[JobRecord]:
    """The jobs to list (`jobs` newest first): those still running; all; the `last`
    newest; or by default the RECENT newest plus any older one still running."""
    if every:
        return list(jobs)
    if running:
        return [job for job in jobs if not job.state.is_terminal]
    if last is not None:
        return jobs[:last]
    return [job for i, job in enumerate(jobs) if i < RECENT or not job.state.is_terminal]


def with_root_cause(data: dict, job: JobRecord) -> dict:
    """A job's JSON, with its root cause (shoal/launch/root_cause.py) if it failed and one was kept."""
    cause = load_root_cause(job.job_dir) if job.state is JobState.FAILED else None
    return {**data, "root_cause": cause.as_json()} if cause is not None else data


def with_unchecked(data: dict, unchecked: dict[str, str]) -> dict:
    """A job's JSON with `unchecked`, why it is shown as recorded, if its launcher is gone and
    its executor could not be asked about its tasks."""
    return {**data, "unchecked": unchecked[data["id"]]} if data["id"] in unchecked else data


def with_figures(data: dict, job: JobRecord) -> dict:
    """A job's JSON with each task's straggler figures (shoal/launch/stragglers.py: `slow`,
    `slow_by`, `dropped`) and the job's `stragglers`, the tasks flagged slow."""
    shown = figures(job.tasks)
    tasks = [{**task, **f.as_json()} for task, f in zip(data["tasks"], shown, strict=True)]
    return {**data, "tasks": tasks, "stragglers": [f.name for f in shown if f.slow]}


def jobs_table(jobs: list[JobRecord], running_only: bool = False) -> str:
    rows = [("#", "ID", "NAME", "STATE", "TASKS", "STEP", "LOSS", "STARTED")]
    for job in jobs:
        rows.append((
            "" if job.number is None else str(job.number),
            job.id, job.name, job.state.value, running_of(t.state for t in job.tasks) if job.tasks else _no_tasks(job),
            "" if job.step is None else str(job.step),
            "" if job.loss is None else f"{job.loss:.4g}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.created)),
        ))
    if jobs:
        return table(rows)
    return "no job is running" if running_only else "no jobs yet; start one with shoal train SPEC.yaml"


def _no_tasks(job: JobRecord) -> str:
    """The TASKS column of a job recorded before it had tasks: waiting in a queue (`--slurm`)."""
    return "queued" if job.state is JobState.PENDING else "none started"


def job_table(job: JobRecord) -> str:
    head = f"job {job.id}  {job.state.value}"
    if job.reason:
        head += f" ({job.reason})"
    if job.exit_code is not None:
        head += f"  exit {job.exit_code}"
    shown = figures(job.tasks)
    if any(f.step_ms is not None or f.pushed for f in shown):  # straggler columns, when tasks report them
        rows = [("TASK", "STATE", "PID", "RESTARTS", "STEP MS MED/P95", "APPLIED", "FLAG", "ADDRESS", "DETAIL")]
        for t, f in zip(job.tasks, shown, strict=True):
            rows.append((t.label, t.state.value, str(t.pid or ""), str(t.restarts), f.step_text(),
                         f.applied_text(), f.flag_text(), t.address, detail_text(t)))
    else:
        rows = [("TASK", "STATE", "PID", "RESTARTS", "ADDRESS", "DETAIL")]
        for t in job.tasks:
            rows.append((t.label, t.state.value, str(t.pid or ""), str(t.restarts), t.address, detail_text(t)))
    where = f"logs: {job.job_dir}/logs   model dir: {job.model_dir}"
    if job.number is not None:
        where = f"number: {job.number}   {where}"
    if not job.tasks:  # recorded while it waited in a queue (--slurm): no plan, no tasks yet
        number = f"number: {job.number}   " if job.number is not None else ""
        what = ("it waits in the queue; its tasks start once it runs (shoal kill cancels it)"
                if job.state is JobState.PENDING else "no task of it ever started")
        return f"{head}\n{number}{what}"
    if job.membership_version is not None:  # the ps's view: a MEMBER column after STATE
        members = set(job.members)
        rows = [rows[0][:2] + ("MEMBER",) + rows[0][2:]] + [
            row[:2] + (_member_text(t, members),) + row[2:] for t, row in zip(job.tasks, rows[1:], strict=True)]
        where += f"\n{membership_text(job)}"
    return f"{head}\n{where}\n{table(rows)}"


def detail_text(task: TaskRecord) -> str:
    """A task's DETAIL without the "pid N" the PID column shows already: a running task's
    "pid 4242 on node3" reads "on node3", a local one's nothing."""
    said = f"pid {task.pid}"
    if task.pid is None or not (task.detail == said or task.detail.startswith(said + " ")):
        return task.detail
    return task.detail[len(said):].strip()


def membership_text(job: JobRecord) -> str:
    """"membership v3 (ps:0): 2 training [chief:0, worker:0]; worker:1 left (...)"."""
    tasks = job.membership_tasks or ""
    count = len(job.members)
    text = f"membership v{job.membership_version} (ps:0): {count} training [{tasks}]"
    return text + (f"; {job.membership_change}" if job.membership_change else "")


def _member_text(task: TaskRecord, members: set[str]) -> str:
    """"training" for a running task in the ps's membership, "out" for a running chief or
    worker outside it (dropped, say for a missed heartbeat, or not joined yet), "-" for one no
    longer running (the ps's last membership line may predate its end: a launcher killed with
    the job), "" for tasks that never train (ps, evaluator)."""
    if task.name.split(".")[0] not in ("chief", "worker"):
        return ""
    if task.state.is_terminal:
        return "-"
    return "training" if task.name in members else "out"


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of jobs >= 1")
    return value


def table(rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns separated by two spaces; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)
