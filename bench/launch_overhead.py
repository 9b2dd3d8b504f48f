"""Launcher overhead: from `shoal run` until every task has started, for 1 to 32 tasks,
minus the program's own start-up.

Each task is `python -S -c 'print(time.time())'`: its first act is to print the wall time
at which it started. For N tasks we measure

  shoal:    t(last task started) - t(just before `shoal run --workers N -- ...` is spawned)
  baseline: the same N programs spawned directly from this process

Every process here is started by bench/jobrun.py, as in every benchmark: its own process
group, killed by the kernel if the benchmark dies, killed in `finally`, bounded by --timeout.
Shoal's local executor starts its tasks the same way (new session, parent-death signal), so
the baseline pays the same per-process spawn cost as the launcher's tasks.

and report (shoal - baseline) / N, the launcher's cost per task beyond the program's own
start-up, together with the fixed part (the `shoal` CLI's own interpreter start and
imports, measured as `shoal run --dry-run` of one task). Median of --repeat runs.
Goal (issue 4): < 50 ms per task.

    python bench/launch_overhead.py [--repeat 3] [--tasks 1,2,4,8,16,32]   # or python -m bench.launch_overhead
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/launch_overhead.py`: find the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.jobrun import Job, Launch, Output, Task, clean_env  # noqa: E402

PROGRAM = ("-S", "-c", "import time; print(repr(time.time()))")
SHOAL = ("-m", "shoal.cli.main")


class TaskFailed(RuntimeError):
    """A process of the benchmark did not exit 0 in time."""


def first_times(texts: list[str]) -> list[float]:
    return [float(text.split()[0]) for text in texts]


def _check(job: Job, deadline: float) -> None:
    """Wait for every task of `job`; raise TaskFailed naming the first that did not exit 0."""
    for name, code in job.wait(deadline, until_failure=True).items():
        if code != 0:
            task = job.task(name)
            job.close()  # the tail is complete once the readers are joined
            raise TaskFailed(f"{name} {'ran past the --timeout' if code is None else f'exited {code}'}"
                             + (f"; its last lines:\n{task.tail()}" if task.lines else ""))


def run_shoal(n: int, home: Path, timeout_s: float) -> float:
    env = clean_env(os.environ, {"SHOAL_HOME": str(home)})
    with Job() as job:
        t0 = time.time()
        job.start(Launch("shoal run", (*SHOAL, "run", "--name", "bench", "--workers", str(n), "--", sys.executable,
                                       *PROGRAM), env, output=Output.DISCARD))
        _check(job, time.monotonic() + timeout_s)
    job_dir = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    logs = [p.read_text() for p in (job_dir / "logs").glob("worker.*.log")]
    assert len(logs) == n, f"expected {n} logs, got {len(logs)}"
    return max(first_times(logs)) - t0


def run_direct(n: int, timeout_s: float) -> float:
    env = clean_env(os.environ)
    with Job() as job:
        t0 = time.time()
        tasks: list[Task] = [job.start(Launch(f"direct:{i}", PROGRAM, env, output=Output.CAPTURE)) for i in range(n)]
        _check(job, time.monotonic() + timeout_s)
    return max(first_times([t.lines[0][1] for t in tasks])) - t0


def cli_startup(timeout_s: float) -> float:
    with Job() as job:
        t0 = time.perf_counter()
        job.start(Launch("shoal dry run", (*SHOAL, "run", "--workers", "1", "--dry-run", "--", "true"),
                         clean_env(os.environ), output=Output.CAPTURE))
        _check(job, time.monotonic() + timeout_s)
        return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tasks", default="1,2,4,8,16,32")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one launch may take (default 120)")
    args = parser.parse_args()
    counts = [int(n) for n in args.tasks.split(",")]
    fixed = statistics.median(cli_startup(args.timeout) for _ in range(args.repeat))
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(f"fixed cost: shoal CLI start-up (dry run of 1 task) {fixed * 1000:.0f} ms\n")
    print(f"{'tasks':>5}  {'shoal ms':>9}  {'direct ms':>9}  {'overhead ms':>11}  "
          f"{'per task ms':>11}  {'per task ms, less CLI start-up':>30}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            shoal = statistics.median(run_shoal(n, Path(tmp), args.timeout) for _ in range(args.repeat))
            direct = statistics.median(run_direct(n, args.timeout) for _ in range(args.repeat))
            overhead = shoal - direct
            print(f"{n:>5}  {shoal * 1000:>9.0f}  {direct * 1000:>9.0f}  {overhead * 1000:>11.0f}"
                  f"  {overhead / n * 1000:>11.1f}  {(overhead - fixed) / n * 1000:>30.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
