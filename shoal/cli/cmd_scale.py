"""`shoal scale JOB worker=N|ps=N [--timeout S]`: change how many workers (or ps) a running
job has.

The job's spec must give the range (`roles.worker.count: 2..8`, `roles.ps.count: 1..3`, or
`shoal run --workers 2..8 --ps 1..3`). The request goes to the job's launcher — in a terminal
or detached — as a file in the job's folder (shoal/launch/scale_requests.py); the launcher
starts the new tasks (fresh indices) or stops the highest-index workers, and answers. Scaling
down waits, within the timeout, until the stopped workers are gone. A ps count only grows.
"""

from __future__ import annotations

import argparse
import difflib
import time

from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import JOB_HELP, RUNNING_FIRST
from shoal.cluster import JOBS
from shoal.launch.control import launcher_alive, reconcile
from shoal.launch.errors import ScaleError
from shoal.launch.job_refs import find_running_job
from shoal.launch.records import JobRecord, JobStore
from shoal.launch.scale_requests import abandon, submit, wait_answer, withdraw
from shoal.launch.scaling import ScaleOutcome, ScaleRequest

DEFAULT_TIMEOUT_S = 30.0
_POLL = 0.1


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "scale", help="change how many workers a running job has (worker=N), or add ps (ps=N)",
        usage="%(prog)s [-h] [--timeout S] [JOB] ROLE=N",  # argparse's own would offer repeats: one role a call
        description="Set the number of workers (or ps) of a running job to N, within the range"
        " its spec gives (roles.worker.count: MIN..MAX, roles.ps.count: MIN..MAX, or shoal run"
        " --workers MIN..MAX --ps MIN..MAX). Works for local and ssh jobs, whether the launcher"
        " runs in a terminal or detached; not for Slurm jobs yet. New tasks get fresh indices and"
        " start at once; scaling workers down stops the highest-index ones (TERM, grace, KILL),"
        " an expected end that is not restarted. A new ps gets a TF_CONFIG listing every ps of"
        " the job with its own address at its index; it registers with ps 0 and the chief moves"
        " shards onto it while training goes on (docs/elastic.md); tasks started later keep the"
        " ps list the job started with and learn the added ps from the ps. Examples: shoal scale"
        " mnist worker=4; shoal scale mnist ps=3",
        epilog="Only workers scale down; ps scale up only: a ps holds shards of the variables,"
        " and one whose process exits is restarted (--restart on-failure) or ends the job; one out of"
        " reach is re-homed by the chief after --ps_recovery_timeout, which is recovery from a"
        " loss, not what scale does. A cluster has one chief.")
    parser.add_argument("words", nargs="+", metavar="[JOB] ROLE=N",
                        help=f"JOB: {JOB_HELP} (default: {RUNNING_FIRST}); ROLE=N: the role and its new"
                        " count, worker=4 or ps=3 (ps grow only)")
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds to wait for the launcher to answer, and for stopped workers"
                        f" to end (default: {DEFAULT_TIMEOUT_S:g})")
    parser.set_defaults(handler=run)


def parse_assignment(text: str) -> ScaleRequest:
    """"worker=4" -> ScaleRequest("worker", 4); UsageError naming the bad part and the fix."""
    role, sep, count = text.partition("=")
    role, count = role.strip(), count.strip()
    if not sep or not role:
        raise UsageError(f"{text!r} is not ROLE=N; write e.g. worker=4")
    if role not in JOBS:
        close = difflib.get_close_matches(role, JOBS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UsageError(f"{role!r} is not a role{hint}; write worker=N or ps=N (only workers and ps"
                         " scale)")
    if not count.isdigit() or not count.isascii():
        raise UsageError(f"{count!r} in {text!r} is not a count of tasks (0, 1, 2, ...); write e.g. {role}=4")
    return ScaleRequest(role, int(count))


def job_and_assignment(words: list[str]) -> tuple[str | None, str]:
    """`[JOB] ROLE=N` as typed: (JOB or None, ROLE=N); UsageError for anything else."""
    if len(words) == 1:
        return None, words[0]
    if len(words) == 2:
        return words[0], words[1]
    raise UsageError(f"give JOB and one ROLE=N, not {len(words)} words ({' '.join(words)}); e.g. shoal scale mnist"
                     " worker=4 (one role per call)")


def run(args: argparse.Namespace, env: Environment) -> int:
    job_ref, assignment = job_and_assignment(args.words)
    request = parse_assignment(assignment)
    with env.store() as store:
        job = find_running_job(store, job_ref)
        job = reconcile(store, job, env.executor(job.executor))
        if job.state.is_terminal:
            which, comma = ("", "") if job_ref else ("no job is running, and the newest, ", ",")
            raise ScaleError(f"{which}job {job.handle}{comma} is not running ({job.state.value}); shoal scale"
                             " changes running jobs only (start it again, with shoal train or shoal run)")
        deadline = time.monotonic() + args.timeout
        outcome = _ask(store, job, request, args.timeout)
        if outcome.error:
            raise ScaleError(outcome.error)
        text = outcome.describe()
        if outcome.stopping:
            if _wait_ended(store, job.id, outcome.stopping, deadline):
                text = text.replace(": stopping ", ": stopped ", 1)
            else:
                text += (f" (still stopping after {args.timeout:g}s; shoal status {job.number or job.id}"
                         " shows when they end)")
    env.say(text)
    return int(ExitCode.OK)


def _ask(store: JobStore, job: JobRecord, request: ScaleRequest, timeout: float) -> ScaleOutcome:
    """Send `request` to the job's launcher and wait (bounded) for its answer; ScaleError if none."""
    token = submit(job.job_dir, request)

    def running() -> bool:
        return not store.find(job.id).state.is_terminal and launcher_alive(job)

    answer = wait_answer(job.job_dir, token, timeout, running)
    if answer is not None:
        return answer
    withdrawn = withdraw(job.job_dir, token)
    if not withdrawn:  # the launcher claimed it: its answer may be there now, or come later
        answer = abandon(job.job_dir, token)
        if answer is not None:
            return answer
    now = store.find(job.id)
    if now.state.is_terminal or not launcher_alive(job):
        ended = (f"ended ({now.state.value})" if now.state.is_terminal
                 else f"lost its launcher (pid {job.launcher_pid} is gone)")
        if withdrawn:
            raise ScaleError(f"job {job.handle} {ended} before its launcher took the"
                             f" request {request.describe()}; nothing was changed")
        raise ScaleError(
            f"job {job.handle} {ended} after its launcher had taken the request"
            f" {request.describe()} but before it answered; the request may have been applied before"
            f" the end: shoal status {job.number or job.id} shows every task, added and stopped")
    if withdrawn:
        raise ScaleError(
            f"the launcher of job {job.handle} (pid {job.launcher_pid}) did not take the request"
            f" {request.describe()} within {timeout:g}s, so it was withdrawn and nothing changed;"
            f" the launcher may be busy or stuck (see {job.job_dir}/launcher.log or shoal attach"
            f" {job.number or job.id}); try again, or with a longer --timeout")
    raise ScaleError(
        f"the launcher of job {job.handle} took the request {request.describe()} but did not"
        f" answer within {timeout:g}s; shoal status {job.number or job.id} shows what changed")


def _wait_ended(store: JobStore, job_id: str, tasks: tuple[str, ...], deadline: float) -> bool:
    """Wait until the records show every task of `tasks` ("worker:3") ended; False at `deadline`."""
    names = {task.replace(":", ".") for task in tasks}
    while True:
        job = store.find(job_id)
        if all(t.state.is_terminal for t in job.tasks if t.name in names):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)


def _seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value
