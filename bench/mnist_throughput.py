"""Distributed MNIST with 2 ps + 2 workers: examples/s, time to first step, peak RSS.

    python -m bench.mnist_throughput            # table
    python -m bench.mnist_throughput --json     # table, then one JSON object as the last line

Runs examples/mnist_softmax.py (and examples/mnist_mlp_torch.py when it exists) unchanged, as
a real job: four processes on 127.0.0.1, each in its own process group, with TF_CONFIG and
SHOAL_JOB_SECRET in their environment, ps first (as tests/cluster/harness.py starts them).
Configurations run interleaved (softmax async, softmax sync, mlp async, mlp sync, then
again), and each figure is the median over the repeats.

How each figure is measured (nothing is added to the examples):

    examples/s     The workers run with `--log_every 1`, so each finished local step prints one
                   `step=N loss=X examples/s=R` line, flushed. This process timestamps every
                   line as it arrives through the worker's stdout pipe. Throughput is counted
                   while both workers train: from the later worker's first step to the
                   earlier worker's last step, (lines in that window) x batch / window. This
                   leaves out start-up and the tail where one worker already stopped.
                   `self_reported` is the sum of the workers' own last `examples/s=` values
                   (their rate over their whole loop), as a cross-check.
    first step     From launching the first process (ps:0) to the arrival of a worker's first
                   progress line, i.e. the end of its first training step: interpreter start,
                   imports, loading MNIST, connecting, the chief's initialization, one step.
                   Reported for the slower worker (the cluster has taken its first step).
    CPU            CPU time (user + system) of each task, sampled every 50 ms and interpolated
                   to the same window, per example: `cpu us/ex` (worker / ps parts). Unlike
                   examples/s it barely depends on the other load on the machine;
                   `cpu-bound/s` = cores / (CPU per example) is what these four processes
                   would reach with the cores to themselves, and `others` is the share of
                   the cores that other processes used during the window (the noise level).
    peak RSS       psutil RSS of each task (plus any children) sampled every 50 ms; also the
                   private part (RSS minus shared pages: the MNIST arrays are an mmap of the
                   cached .npy files, shared between the workers but counted in RSS).

The reference figures are real TensorFlow 2.21 on a machine like this one (issue 2), not
measured in this run: TF1 async 28k examples/s, TF1 SyncReplicasOptimizer 23k, 5-9 s from
launch to first step, 600-735 MB RSS per process. Shoal's goals: >= 3x those throughputs,
<= 1.5 s to first step, <= 100 MB RSS per ps process. TensorFlow was measured on the softmax
program only, so the MLP rows have no throughput reference ("n/a").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import REPO, free_ports, kill_group, machine, median, spawn

EXAMPLES = {"softmax": "examples/mnist_softmax.py", "mlp": "examples/mnist_mlp_torch.py"}
STEPS = {"softmax": 3000, "mlp": 1000}  # global steps: a few seconds of steady training each
MODES = {"async": [], "sync": ["--sync"]}
REFERENCE_TF1 = {"async": 28_000, "sync": 23_000}
GOAL_RATIO = 3.0
GOAL_FIRST_STEP_S = 1.5
GOAL_PS_RSS_MB = 100
BATCH = 100
PROGRESS = re.compile(r"step=(\d+) loss=(\S+) examples/s=(\d+)")
ACCURACY = re.compile(r"accuracy: (\d+\.\d+)")
MB = 1e6


@dataclass
class Task:
    """One launched task: its process, the lines it printed with their arrival times, and
    its memory peaks. The reader thread appends to `lines`; read them after it finished."""

    name: str
    proc: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    peak_rss: int = 0
    peak_private: int = 0
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (time, CPU seconds used so far)
    reader: threading.Thread | None = None

    def read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def progress_times(self) -> list[float]:
        return [t for t, line in self.lines if PROGRESS.search(line)]

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def sample_usage(tasks: list[Task], machine_cpu: list[tuple[float, float]], stop: threading.Event,
                 period_s: float = 0.05) -> None:
    """Until `stop`, record each task's peak RSS and its CPU time (its process and all its
    children), and the CPU time the whole machine spent busy."""
    handles: dict[str, psutil.Process] = {}
    while not stop.is_set():
        busy = psutil.cpu_times()
        machine_cpu.append((time.monotonic(), sum(busy) - busy.idle - getattr(busy, "iowait", 0.0)))
        for task in tasks:
            if task.proc.poll() is not None:
                continue
            try:
                proc = handles.setdefault(task.name, psutil.Process(task.proc.pid))
                procs = [proc, *proc.children(recursive=True)]
                rss = private = 0
                cpu = 0.0
                for p in procs:
                    info = p.memory_info()
                    rss += info.rss
                    private += info.rss - info.shared
                    times = p.cpu_times()
                    cpu += times.user + times.system
                task.cpu.append((time.monotonic(), cpu))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            task.peak_rss = max(task.peak_rss, rss)
            task.peak_private = max(task.peak_private, private)
        stop.wait(period_s)


def run_job(example: str, mode: str, steps: int, timeout_s: float, py_spy: Path | None = None) -> dict:
    """Launch 2 ps + 2 workers of `example`, wait for them, and measure. Blocks."""
    ports = free_ports(4)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    secret = secrets.token_hex(16)
    argv = [EXAMPLES[example], "--steps", str(steps), "--log_every", "1", *MODES[mode]]
    tasks: list[Task] = []
    spies: list[subprocess.Popen] = []
    stop = threading.Event()
    machine_cpu: list[tuple[float, float]] = []
    sampler = threading.Thread(target=sample_usage, args=(tasks, machine_cpu, stop), daemon=True)
    launched = time.monotonic()
    try:
        for job, index in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)):
            env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_") and k != "TF_CONFIG"}
            env.update(TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": job, "index": index}}),
                       SHOAL_JOB_SECRET=secret, PYTHONUNBUFFERED="1")
            proc = spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            task = Task(f"{job}:{index}", proc)
            task.reader = threading.Thread(target=task.read, daemon=True)
            task.reader.start()
            tasks.append(task)
            if py_spy is not None and index == 0:
                spies.append(_attach_py_spy(proc.pid, py_spy / f"{example}_{mode}_{job}{index}.txt"))
        sampler.start()
        deadline = launched + timeout_s
        codes = {}
        for task in tasks:
            try:
                codes[task.name] = task.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[task.name] = None
        ended = time.monotonic()
    finally:
        stop.set()
        for task in tasks:
            kill_group(task.proc)
        for spy in spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(spy)
        for task in tasks:
            if task.reader is not None:
                task.reader.join(5)
        if sampler.is_alive():
            sampler.join(5)
    return _measure(example, mode, steps, tasks, codes, launched, ended, machine_cpu)


def _attach_py_spy(pid: int, out: Path) -> subprocess.Popen:
    """Sample `pid` until it exits (idle time included, so percentages are of wall time)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(exe if exe.exists() else "py-spy"), "record", "-p", str(pid), "--idle", "--threads",
                             "--nonblocking", "-r", "100", "-f", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _at(series: list[tuple[float, float]], t: float) -> float:
    """Linear interpolation of a sampled, increasing (time, value) series at time `t`."""
    if not series:
        return 0.0
    for (t0, v0), (t1, v1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return series[0][1] if t < series[0][0] else series[-1][1]


def _measure(example: str, mode: str, steps: int, tasks: list[Task], codes: dict, launched: float,
             ended: float, machine_cpu: list[tuple[float, float]]) -> dict:
    workers = [t for t in tasks if t.name.startswith("worker")]
    times = [w.progress_times() for w in workers]
    ok = all(c == 0 for c in codes.values()) and all(times)
    run: dict = {"example": example, "mode": mode, "steps": steps, "exit_codes": codes, "ok": ok,
                 "wall_s": round(ended - launched, 3),
                 "peak_rss_mb": {t.name: round(t.peak_rss / MB, 1) for t in tasks},
                 "peak_private_mb": {t.name: round(t.peak_private / MB, 1) for t in tasks}}
    if not ok:
        run["error"] = {t.name: t.tail() for t in tasks if codes.get(t.name) != 0 or t in workers}
        return run
    start, end = max(ts[0] for ts in times), min(ts[-1] for ts in times)
    in_window = sum(1 for ts in times for t in ts if start < t <= end)
    first_all, last_all = min(ts[0] for ts in times), max(ts[-1] for ts in times)
    self_reported = []
    accuracies = []
    for w in workers:
        rates = [int(m.group(3)) for _, line in w.lines if (m := PROGRESS.search(line))]
        self_reported.append(rates[-1])
        acc = [float(m.group(1)) for _, line in w.lines if (m := ACCURACY.search(line))]
        accuracies.append(acc[-1] if acc else None)
    # CPU time per example in the window: unlike examples/s, it hardly depends on what else
    # the machine runs, so it tells what these four processes would do on the cores alone.
    cpu = {t.name: _at(t.cpu, end) - _at(t.cpu, start) for t in tasks}
    ours = sum(cpu.values())
    examples = in_window * BATCH
    window = end - start
    others = _at(machine_cpu, end) - _at(machine_cpu, start) - ours
    by_job = {job: sum(v for k, v in cpu.items() if k.startswith(job)) for job in ("worker", "ps")}
    run.update({
        "cpu_us_per_example": round(ours / examples * 1e6, 2) if examples else None,
        "cpu_us_per_example_by_job": {job: round(v / examples * 1e6, 2) for job, v in by_job.items()}
        if examples else None,
        "cpu_bound_examples_per_s": round((os.cpu_count() or 1) * examples / ours) if ours > 0 else None,
        "cpu_share_ours": round(ours / (window * (os.cpu_count() or 1)), 2) if window > 0 else None,
        "cpu_share_others": round(max(0.0, others) / (window * (os.cpu_count() or 1)), 2) if window > 0 else None,
        "examples_per_s": round(in_window * BATCH / (end - start)) if end > start else None,
        "examples_per_s_overall": round(sum(len(ts) for ts in times) * BATCH / (last_all - first_all)),
        "examples_per_s_self_reported": sum(self_reported),
        "window_s": round(end - start, 3),
        "local_steps": {w.name: len(ts) for w, ts in zip(workers, times)},
        "first_step_s": {w.name: round(ts[0] - launched, 3) for w, ts in zip(workers, times)},
        "first_step_max_s": round(max(ts[0] for ts in times) - launched, 3),
        "accuracy": {w.name: a for w, a in zip(workers, accuracies)},
    })
    return run


def summarize(runs: list[dict]) -> list[dict]:
    """Median over repeats, per (example, mode), with the goals."""
    out = []
    for key in dict.fromkeys((r["example"], r["mode"]) for r in runs):
        group = [r for r in runs if (r["example"], r["mode"]) == key and r["ok"]]
        example, mode = key
        if not group:
            out.append({"example": example, "mode": mode, "ok": False})
            continue
        eps = median([r["examples_per_s"] for r in group])
        first = median([r["first_step_max_s"] for r in group])
        ps_rss = max(max(v for k, v in r["peak_rss_mb"].items() if k.startswith("ps")) for r in group)
        worker_rss = max(max(v for k, v in r["peak_rss_mb"].items() if k.startswith("worker")) for r in group)
        worker_private = max(max(v for k, v in r["peak_private_mb"].items() if k.startswith("worker")) for r in group)
        ref = REFERENCE_TF1[mode] if example == "softmax" else None  # TF was measured on softmax only
        out.append({
            "example": example, "mode": mode, "ok": True, "repeats": len(group),
            "examples_per_s": round(eps), "examples_per_s_all": [r["examples_per_s"] for r in group],
            "examples_per_s_self_reported": round(median([r["examples_per_s_self_reported"] for r in group])),
            "tf1_reference": ref, "ratio_vs_tf1": round(eps / ref, 2) if ref else None,
            "throughput_goal_met": eps >= GOAL_RATIO * ref if ref else None,
            "first_step_s": round(first, 2), "first_step_all": [r["first_step_max_s"] for r in group],
            "first_step_goal_met": first <= GOAL_FIRST_STEP_S,
            "peak_rss_mb_ps": ps_rss, "peak_rss_mb_worker": worker_rss, "peak_private_mb_worker": worker_private,
            "ps_rss_goal_met": ps_rss <= GOAL_PS_RSS_MB,
            "accuracy_min": min(a for r in group for a in r["accuracy"].values() if a is not None),
            "cpu_us_per_example": median([r["cpu_us_per_example"] for r in group]),
            "cpu_us_per_example_worker": median([r["cpu_us_per_example_by_job"]["worker"] for r in group]),
            "cpu_us_per_example_ps": median([r["cpu_us_per_example_by_job"]["ps"] for r in group]),
            "cpu_bound_examples_per_s": round(median([r["cpu_bound_examples_per_s"] for r in group])),
            "cpu_share_others": median([r["cpu_share_others"] for r in group]),
        })
    return out


def _table(summary: list[dict]) -> str:
    rows = [f"{'example':8} {'mode':5} {'examples/s':>10} {'vs TF1':>7} {'(self)':>8} {'1st step s':>10} "
            f"{'ps RSS MB':>9} {'wk RSS MB':>9} {'wk priv MB':>10} {'acc':>6} {'cpu us/ex':>9} {'w/ps':>11} "
            f"{'cpu-bound/s':>11} {'others':>6}  goals (3x TF1 / 1.5 s / ps 100 MB)"]
    for s in summary:
        if not s["ok"]:
            rows.append(f"{s['example']:8} {s['mode']:5} FAILED (see the JSON 'runs' for the tasks' output)")
            continue
        goals = "/".join({True: "met", False: "MISSED", None: "n/a"}[s[k]]
                         for k in ("throughput_goal_met", "first_step_goal_met", "ps_rss_goal_met"))
        vs_tf1 = f"{s['ratio_vs_tf1']:>6.2f}x" if s["ratio_vs_tf1"] else f"{'n/a':>7}"
        rows.append(f"{s['example']:8} {s['mode']:5} {s['examples_per_s']:>10} {vs_tf1} "
                    f"{s['examples_per_s_self_reported']:>8} {s['first_step_s']:>10.2f} {s['peak_rss_mb_ps']:>9.0f} "
                    f"{s['peak_rss_mb_worker']:>9.0f} {s['peak_private_mb_worker']:>10.0f} {s['accuracy_min']:>6.3f} "
                    f"{s['cpu_us_per_example']:>9.1f} "
                    f"{s['cpu_us_per_example_worker']:>5.1f}/{s['cpu_us_per_example_ps']:<5.1f} "
                    f"{s['cpu_bound_examples_per_s']:>11} {s['cpu_share_others']:>6.2f}  {goals}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    parser.add_argument("--examples", default=",".join(EXAMPLES), help=f"comma-separated, of {', '.join(EXAMPLES)}")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of async, sync")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="global steps per run (default: " + ", ".join(f"{k} {v}" for k, v in STEPS.items()) + ")")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record ps:0 and worker:0 of every run with py-spy (raw stacks) into DIR; "
                             "the figures of such runs are slowed by the sampling")
    args = parser.parse_args(argv)
    examples = [e for e in args.examples.split(",") if e]
    modes = [m for m in args.modes.split(",") if m]
    if not set(examples) <= set(EXAMPLES) or not set(modes) <= set(MODES):
        parser.error(f"--examples must be of {', '.join(EXAMPLES)} and --modes of {', '.join(MODES)}")

    skipped = [e for e in examples if not (REPO / EXAMPLES[e]).exists()]
    examples = [e for e in examples if e not in skipped]
    for e in skipped:
        print(f"skipping {e}: {EXAMPLES[e]} does not exist", flush=True)
    from shoal.datasets.mnist import default_cache_dir, load_mnist
    load_mnist(default_cache_dir(os.environ))  # build the .npy cache now, so no run pays for it
    print(f"mnist_throughput: 2 ps + 2 workers, {args.steps or STEPS} steps, {args.repeats} repeats, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}", flush=True)
    runs = []
    started = time.monotonic()
    for r in range(args.repeats):
        for example in examples:
            for mode in modes:
                run = run_job(example, mode, args.steps or STEPS[example], args.timeout, args.py_spy)
                run["repeat"] = r
                runs.append(run)
                if run["ok"]:
                    print(f"  {example} {mode} #{r}: {run['examples_per_s']} examples/s, first step "
                          f"{run['first_step_max_s']:.2f} s, wall {run['wall_s']:.1f} s, peak RSS "
                          f"{run['peak_rss_mb']}", flush=True)
                else:
                    print(f"  {example} {mode} #{r}: FAILED, exit codes {run['exit_codes']}", flush=True)
    summary = summarize(runs)
    print(_table(summary), flush=True)
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs, "skipped": skipped,
                          "reference": {"tf1_async": REFERENCE_TF1["async"], "tf1_sync": REFERENCE_TF1["sync"],
                                        "tf_first_step_s": [5, 9], "tf_rss_mb": [600, 735]},
                          "goals": {"throughput_ratio": GOAL_RATIO, "first_step_s": GOAL_FIRST_STEP_S,
                                    "ps_rss_mb": GOAL_PS_RSS_MB},
                          "machine": machine(), "bench_wall_s": round(time.monotonic() - started, 1)}), flush=True)
    return 0 if all(s["ok"] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
