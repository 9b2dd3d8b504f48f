"""The usage probe: `python -m shoal.launch.usage_probe`, run on a task's host (as a Slurm
step, for `shoal monitor` in another terminal) to measure tasks it did not start.

It reads one JSON object on stdin, `{"interval": S, "tasks": {NAME: [PID, CREATE_TIME]}}`,
measures each task that still runs — the same (pid, create time), so a reused pid is never
taken for it — with its whole process tree over S seconds (at most 5), and writes one JSON
object on stdout: `{"tasks": {NAME: {"cpu": %, "rss": BYTES, "mem_total": BYTES,
"gpu": % | null, "gpu_mem": BYTES | null}}}`; tasks that no longer run are left out.
Nothing is unpickled; what it reads is validated first.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import psutil

from shoal.launch.nvml import gpu_usage
from shoal.launch.processes import same_process

MAX_INPUT = 1 << 20


def measure(tasks: dict[str, tuple[int, float]], interval: float) -> dict[str, dict[str, Any]]:
    """Usage of every task of `tasks` that still runs, over `interval` seconds; blocks."""
    trees: dict[str, list[psutil.Process]] = {}
    for name, (pid, started) in tasks.items():
        leader = same_process(pid, started)
        if leader is None:
            continue
        try:
            trees[name] = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            continue
    for procs in trees.values():
        for proc in procs:
            _quiet(proc.cpu_percent, None)
    time.sleep(min(max(interval, 0.05), 5.0))
    total = psutil.virtual_memory().total
    gpus = gpu_usage()
    out = {}
    for name, procs in trees.items():
        pids = {p.pid for p in procs}
        gpu_pct = gpu_mem = None
        if gpus is not None:
            used = [(pct, mem) for pid, pct, mem in gpus if pid in pids]
            gpu_pct = max((pct for pct, _ in used), default=0.0)
            gpu_mem = sum(mem for _, mem in used)
        out[name] = {"cpu": sum(_quiet(p.cpu_percent, None) or 0.0 for p in procs),
                     "rss": sum(getattr(_quiet(p.memory_info), "rss", 0) for p in procs),
                     "mem_total": total, "gpu": gpu_pct, "gpu_mem": gpu_mem}
    return out


def parse_request(text: str) -> tuple[dict[str, tuple[int, float]], float]:
    """The tasks and interval of a request; ValueError if it is not one."""
    if len(text) > MAX_INPUT:
        raise ValueError(f"a request of {len(text)} bytes is over the {MAX_INPUT}-byte limit")
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
        raise ValueError("expected {\"interval\": S, \"tasks\": {NAME: [PID, CREATE_TIME]}}")
    tasks = {}
    for name, value in data["tasks"].items():
        if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int)
                or not isinstance(value[1], (int, float))):
            raise ValueError(f"task {str(name)[:80]!r}: expected [PID, CREATE_TIME], got {str(value)[:80]}")
        tasks[str(name)] = (value[0], float(value[1]))
    interval = data.get("interval", 0.5)
    if not isinstance(interval, (int, float)):
        raise ValueError(f"interval must be a number of seconds, got {str(interval)[:80]}")
    return tasks, float(interval)


def _quiet(call, *args):
    try:
        return call(*args)
    except psutil.Error:
        return None


def main() -> int:
    try:
        tasks, interval = parse_request(sys.stdin.read(MAX_INPUT + 1))
    except ValueError as e:
        print(f"usage_probe: {e}", file=sys.stderr)
        return 2
    json.dump({"tasks": measure(tasks, interval)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
