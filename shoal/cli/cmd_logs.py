"""`shoal logs [JOB | JOB.ROLE.INDEX] [--task worker.1] [-f]`: print (or follow) a job's
task logs (the newest job's if none is named)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.control import reconcile
from shoal.launch.executor import Executor
from shoal.launch.errors import JobNotFound
from shoal.launch.job_refs import TASK_REF_RE, find_task
from shoal.launch.log_reads import read_new, truncated_note
from shoal.launch.records import JobRecord, JobStore

_POLL = 0.2
_MAX_READ = 1 << 20
"""Bytes of a log read (and printed) at a time: a large log costs bounded memory."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("logs", help="print a job's logs")
    add_job_argument(parser, newest_by_default=True, tasks=True)
    parser.add_argument("--task", help="only this task, e.g. worker.1 (or worker:1)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing new lines until the job is over")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    with env.store() as store:
        job, task_name = _find(store, args.job)
        if args.task:  # worker:1, the runtime's own spelling, names worker.1 too
            args.task = args.task.replace(":", ".")
        if task_name and args.task and job.task(args.task).name != task_name:
            raise UsageError(f"{args.job} names task {task_name}, but --task names"
                             f" {args.task}; give one of them")
        task_name = task_name or args.task
        executor = env.executor(job.executor)
        if not job.tasks:  # recorded while it waits in a queue (--slurm): no task, no log yet
            job = _wait_for_tasks(store, job, executor, env, follow=args.follow)
            if not job.tasks:
                return int(ExitCode.OK)
        tasks = [job.task(task_name)] if task_name else list(job.tasks)
        prefix = (lambda t: b"") if task_name else (lambda t: t.label.encode() + b" | ")
        offsets = {t.name: 0 for t in tasks}
        while True:
            for task in tasks:
                offsets[task.name] = _copy(Path(task.log_path), offsets[task.name],
                                           prefix(task), env)
            if not args.follow:
                break
            job = reconcile(store, store.find(job.id), executor)
            if job.state.is_terminal:
                for task in tasks:  # the last lines written before the job ended
                    _copy(Path(task.log_path), offsets[task.name], prefix(task), env,
                          final=True)
                break
            time.sleep(_POLL)
        _say_silent(store.find(job.id), [t.name for t in tasks], env)
    return int(ExitCode.OK)


def _say_silent(job: JobRecord, names: list[str], env: Environment) -> None:
    """On stderr, for each of the tasks `names` of `job` that has no log at all: its state and
    why (a command that could not start: "FAILED (exit 127: cannot run ...)")."""
    for task in (t for t in job.tasks if t.name in names and not Path(t.log_path).exists()):
        why = f" ({task.detail})" if task.detail else ""
        env.say(f"{task.label}: no log: {task.state.value}{why}", err=True)


def _find(store: JobStore, ref: str | None) -> tuple[JobRecord, str | None]:
    """The job and task `ref` names (find_task); a task of a job still waiting in the queue
    (it has no tasks yet) names the job, so the wait is said, not "no such task"."""
    try:
        return find_task(store, ref)
    except JobNotFound:
        match = TASK_REF_RE.fullmatch(ref or "")
        if match is None:
            raise
        job = store.find(match.group("job"))
        if job.tasks:
            raise
        return job, None


def _wait_for_tasks(store: JobStore, job: JobRecord, executor: Executor, env: Environment, *,
                    follow: bool) -> JobRecord:
    """A job recorded before it had tasks (waiting in a queue): say so; with `follow`, block
    until it has tasks or is over. Returns the job as last read."""
    if job.state.is_terminal:
        env.say(f"job {job.handle}: {job.state.value} before any task started ({job.reason})", err=True)
        return job
    env.say(f"job {job.handle} waits in the queue ({job.reason}); no task has started"
            + (", following it" if follow else ", so there are no logs yet (--follow waits for them)"), err=True)
    while follow and not job.tasks and not job.state.is_terminal:
        time.sleep(_POLL)
        job = reconcile(store, store.find(job.id), executor)
    return job


def _copy(path: Path, offset: int, prefix: bytes, env: Environment, final: bool = False) -> int:
    """Print the whole lines of `path` after `offset`, each with `prefix`; with `final`, a last
    line without newline too (completed with one). Returns the new offset. Reads and prints in
    steps of at most `_MAX_READ` bytes, so a log of any size costs bounded memory; a line longer
    than that is printed in pieces (whole, within one call, unless the file ends inside it). A
    file now shorter than `offset` was truncated: it is printed again from its start, after a
    note on stderr. Blocks on the file and stdout."""
    at_line_start = True  # what this call printed so far ends with "\n" (or is nothing)
    while True:
        try:
            new = read_new(path, offset, _MAX_READ)
        except FileNotFoundError:
            break
        if new.truncated:
            if not at_line_start:
                _print(b"\n", b"", False, env)
                at_line_start = True
            env.stdout_bytes.flush()
            env.say(truncated_note(path), err=True)
        data, offset = new.data, new.offset
        full = len(data) == _MAX_READ
        end = data.rfind(b"\n") + 1
        if final or (end == 0 and full):  # the last line; or a line longer than a read, in pieces
            end = len(data)
        if end > 0:
            _print(data[:end], prefix, at_line_start, env)
            at_line_start = data[end - 1:end] == b"\n"
            offset += end
        if not full:
            break
    if not at_line_start:  # a line the file (still) ends inside: completed, it is all there is for now
        _print(b"\n", b"", False, env)
    return offset


def _print(piece: bytes, prefix: bytes, at_line_start: bool, env: Environment) -> None:
    """Print `piece` of a log with `prefix` at the start of each of its lines (not at its start
    when it goes on a line printed before, `at_line_start` false)."""
    out = piece.replace(b"\n", b"\n" + prefix) if prefix else piece
    if prefix and piece.endswith(b"\n"):
        out = out[:-len(prefix)]  # no line starts after the last newline yet
    if at_line_start:
        out = prefix + out
    env.stdout.flush()
    env.stdout_bytes.write(out)
    env.stdout_bytes.flush()
