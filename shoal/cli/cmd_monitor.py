"""`shoal monitor [JOB] [--once] [--interval S]`: CPU, memory and GPU use per task of a job
(the newest if none is named), and the straggler figures of the tasks that report them."""

from __future__ import annotations

import argparse
import time

from shoal.cli.cmd_status import table
from shoal.cli.arg_types import positive_duration
from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.cli.job_args import add_job_argument
from shoal.launch.control import reconcile
from shoal.launch.job_refs import find_running_job
from shoal.launch.monitor import TaskSample, sample_job
from shoal.launch.stragglers import TaskFigures, figures

_CLEAR_SCREEN = "\x1b[H\x1b[2J"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("monitor", help="show CPU, memory and GPU use per task")
    add_job_argument(parser, newest_by_default=True, running_first=True)
    parser.add_argument("--once", action="store_true", help="print one sample and exit")
    parser.add_argument("--interval", type=positive_duration, default=2.0,
                        help="time between samples: seconds, or 500ms, 10s (default: 2)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    """Print a table of the job's tasks every `--interval` (once with `--once`) until the job
    ends. Blocks."""
    with env.store() as store:
        job_id = find_running_job(store, args.job).id  # the same job all along, even if a newer one starts
        while True:
            started = time.monotonic()
            job = store.find(job_id)
            executor = env.executor(job.executor)
            job = reconcile(store, job, executor)
            samples = sample_job(store, job, executor, interval=min(args.interval, 0.5)
                                 if args.once else args.interval)
            table = (samples_table(samples, figures(job.tasks)) if job.tasks else
                     f"no task has started ({job.reason})" if job.reason else "no task has started")
            text = f"job {job.id}  {job.state.value}\n{table}"
            if args.once or job.state.is_terminal:
                env.say(text)
                return int(ExitCode.OK)
            env.say((_CLEAR_SCREEN if env.is_tty else "") + text)
            # (sampling took the interval when tasks ran; with none, e.g. queued, it returned at once)
            time.sleep(max(0.0, started + args.interval - time.monotonic()))


def samples_table(samples: list[TaskSample], shown: "list[TaskFigures] | None" = None) -> str:
    """One row per task, with its host when some task runs on another machine (ssh, Slurm);
    when some task reports straggler figures (shoal/launch/stragglers.py, `shown` in the same
    order) three columns more at the end: step time median/p95 (ms), gradients applied, and
    the slow flag."""
    with_figures = bool(shown) and any(f.step_ms is not None or f.pushed for f in shown)
    with_hosts = any(s.host for s in samples)
    rows = [("TASK", "STATE", *(("HOST",) if with_hosts else ()), "PID", "CPU%", "MEM%", "MEM USED/TOTAL",
             "GPU%", "GPU MEM")]
    if with_figures:
        rows[0] += ("STEP MS MED/P95", "APPLIED", "FLAG")
    for i, s in enumerate(samples):
        use = s.usage
        where = (s.host or "-",) if with_hosts else ()
        if use is None:
            row: tuple[str, ...] = (s.name, s.state.value, *where, str(s.pid or ""), "-", "-", "-", "-", "-")
        else:
            row = (
                s.name, s.state.value, *where, str(s.pid or ""), _num(use.cpu_percent),
                _num(use.mem_percent), f"{_size(use.mem_used)}/{_size(use.mem_total)}",
                _num(use.gpu_percent), _size(use.gpu_mem_used),
            )
        if with_figures:
            f = shown[i]  # type: ignore[index]
            row += (f.step_text(), f.applied_text(), f.flag_text())
        rows.append(row)
    return table(rows)


def _num(value: "float | None") -> str:
    return "-" if value is None else f"{value:.1f}"


def _size(value: "int | None") -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024  # type: ignore[assignment]
    return str(value)
