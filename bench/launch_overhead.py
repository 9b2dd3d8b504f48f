"""Launcher overhead: from `shoal run` until every task has started, for 1 to 32 tasks,
minus the program's own start-up.

Each task is `python -S -c 'print(time.time())'`: its first act is to print the wall time
at which it started. For N tasks we measure

  shoal:    t(last task started) - t(just before `shoal run --workers N -- ...` is spawned)
  baseline: the same N programs spawned directly with subprocess.Popen from this process

and report (shoal - baseline) / N, the launcher's cost per task beyond the program's own
start-up, together with the fixed part (the `shoal` CLI's own interpreter start and
imports, measured as `shoal run --dry-run` of one task). Median of --repeat runs.
Goal (issue 4): < 50 ms per task.

    python bench/launch_overhead.py [--repeat 3] [--tasks 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = [sys.executable, "-S", "-c", "import time; print(repr(time.time()))"]
SHOAL = [sys.executable, "-m", "shoal.cli.main"]


def first_times(texts: list[str]) -> list[float]:
    return [float(text.split()[0]) for text in texts]


def run_shoal(n: int, home: Path) -> float:
    env = dict(os.environ, SHOAL_HOME=str(home))
    t0 = time.time()
    subprocess.run([*SHOAL, "run", "--name", "bench", "--workers", str(n), "--", *PROGRAM],
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    job_dir = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    logs = [p.read_text() for p in (job_dir / "logs").glob("worker.*.log")]
    assert len(logs) == n, f"expected {n} logs, got {len(logs)}"
    return max(first_times(logs)) - t0


def run_direct(n: int) -> float:
    t0 = time.time()
    procs = [subprocess.Popen(PROGRAM, stdout=subprocess.PIPE) for _ in range(n)]
    outs = [p.communicate()[0].decode() for p in procs]
    return max(first_times(outs)) - t0


def cli_startup() -> float:
    t0 = time.perf_counter()
    subprocess.run([*SHOAL, "run", "--workers", "1", "--dry-run", "--", "true"],
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tasks", default="1,2,4,8,16,32")
    args = parser.parse_args()
    counts = [int(n) for n in args.tasks.split(",")]
    fixed = statistics.median(cli_startup() for _ in range(args.repeat))
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(f"fixed cost: shoal CLI start-up (dry run of 1 task) {fixed * 1000:.0f} ms\n")
    print(f"{'tasks':>5}  {'shoal ms':>9}  {'direct ms':>9}  {'overhead ms':>11}  "
          f"{'per task ms':>11}  {'per task ms, less CLI start-up':>30}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            shoal = statistics.median(run_shoal(n, Path(tmp)) for _ in range(args.repeat))
            direct = statistics.median(run_direct(n) for _ in range(args.repeat))
            overhead = shoal - direct
            print(f"{n:>5}  {shoal * 1000:>9.0f}  {direct * 1000:>9.0f}  {overhead * 1000:>11.0f}"
                  f"  {overhead / n * 1000:>11.1f}  {(overhead - fixed) / n * 1000:>30.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
