"""Distributed MNIST with 2 ps + 2 workers: examples/s, time to first step, peak RSS.

    python -m bench.mnist_throughput            # table
    python -m bench.mnist_throughput --json     # table, then one JSON object as the last line

Runs examples/mnist_softmax.py (and examples/mnist_mlp_torch.py when it exists) unchanged, as
a real job: four processes on 127.0.0.1 started by bench/jobrun.py (each in its own process
group), with TF_CONFIG and SHOAL_JOB_SECRET in their environment, ps first (as
tests/cluster/harness.py starts them).
Configurations run interleaved (softmax async, softmax sync, mlp async, mlp sync, then
again), and each figure is the median over the repeats.

How each figure is measured (nothing is added to the examples):

    examples/s     The workers run with `--log_every L` (--log-every, default 10), so every
                   L-th local step prints one `step=N loss=X examples/s=R` line, flushed. This
                   process timestamps every line as it arrives through the worker's stdout
                   pipe. Throughput is counted while both workers train: from the later
                   worker's first line to the earlier worker's last line, (lines in that
                   window) x L x batch / window. The bound's copies print the same lines.
                   (A line every step costs a pipe write and a wake-up of this process per
                   step: it held the softmax's bound to ~1.5M examples/s against ~1.9M, and
                   Shoal's rate by 3-7%, bench/README.md.) This
                   leaves out start-up and the tail where one worker already stopped.
                   `self_reported` is the sum of the workers' own last `examples/s=` values
                   (their rate over their whole loop), as a cross-check.
    first step     From launching the first process (ps:0) to the arrival of a worker's first
                   progress line, i.e. the end of its L-th training step: interpreter start,
                   imports, loading MNIST, connecting, the chief's initialization, L steps
                   (at L = 10, ~2 ms of softmax steps, ~15 ms of MLP ones). Reported for the
                   slower worker (the cluster has taken its first steps).
    CPU            CPU time (user + system) of each task, sampled every 50 ms and interpolated
                   to the same window, per example: `cpu us/ex` (worker / ps parts). Unlike
                   examples/s it barely depends on the other load on the machine;
                   `cpu-bound/s` = cores / (CPU per example) is what these four processes
                   would reach with the cores to themselves, and `others` is the share of
                   the cores that other processes used during the window (the noise level).
    peak RSS       as defined for every bench report in bench/usage.py: the peak, over samples
                   every 50 ms, of the sum of psutil RSS over the task's process and all its
                   children. Beside it, `priv` is the same peak of private memory (RSS minus
                   shared pages: the MNIST arrays are an mmap of the cached .npy files, shared
                   between the workers but counted in RSS).

    /nocomm        Shoal's examples/s as a fraction of the no-communication bound: the same
                   training loop (model, batch, data, one BLAS thread) in 2 processes with no ps
                   and no exchange at all (bench/nocomm.py), measured the same way in the same
                   run: the most examples/s these cores can do for this model.

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
import shutil
import sys
import time
from pathlib import Path

from bench import REPO, free_ports, machine, median
from bench.example_modes import MODE_FLAGS
from bench.jobrun import Job, Launch, Output, Task, clean_env
from bench.usage import UsageSampler, interpolate

EXAMPLES = {"softmax": "examples/mnist_softmax.py", "mlp": "examples/mnist_mlp_torch.py"}
# Global steps per run: 3-4 s of training each at today's rates (softmax ~2.4k steps/s, the MLP
# ~1k), so the start (the first ~0.25 s run at ~0.8 of the steady rate) is a small part of the
# window. At 3000 softmax steps the window was 0.6 s and read 4-8% low (bench/README.md).
STEPS = {"softmax": 20000, "mlp": 3000}
DEFAULT_MODES = ("async", "sync")  # async-overlap is asked for by name
NOCOMM = "nocomm"  # the no-communication bound's rows: bench/nocomm.py, no ps
NOCOMM_COPIES = 2  # as many as the job's workers (and this machine's cores)
NOCOMM_STEPS = {"softmax": 30000, "mlp": 3000}  # local steps per copy: 3-4 s each, as the job's runs
REFERENCE_TF1 = {"async": 28_000, "sync": 23_000}
GOAL_RATIO = 3.0
GOAL_FIRST_STEP_S = 1.5
GOAL_PS_RSS_MB = 100
GOAL_NOCOMM = {"softmax": 0.35, "mlp": 0.7}  # issue 16: fraction of the no-communication bound
BATCH = 100
LOG_EVERY = 10  # local steps per progress line: often enough for the window, rarely enough to cost little
PROGRESS = re.compile(r"step=(\d+) loss=(\S+) examples/s=(\d+)")
ACCURACY = re.compile(r"accuracy: (\d+\.\d+)")
MB = 1e6


def progress_times(task: Task) -> list[float]:
    """Arrival times of the task's progress lines."""
    return [t for t, line in task.lines if PROGRESS.search(line)]


def run_job(example: str, mode: str, steps: int, timeout_s: float, py_spy: Path | None = None,
            log_every: int = LOG_EVERY) -> dict:
    """Launch 2 ps + 2 workers of `example`, wait for them, and measure. Blocks."""
    ports = free_ports(4)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    secret = secrets.token_hex(16)
    argv = (EXAMPLES[example], "--steps", str(steps), "--log_every", str(log_every), *MODE_FLAGS[mode])
    job = Job(UsageSampler())
    spies = Job()  # py-spy ends by itself when its target exits, then writes its file
    try:
        for name, index in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)):
            tf_config = json.dumps({"cluster": spec, "task": {"type": name, "index": index}})
            env = clean_env(os.environ, {"TF_CONFIG": tf_config, "SHOAL_JOB_SECRET": secret})
            task = job.start(Launch(f"{name}:{index}", argv, env, output=Output.CAPTURE))
            if py_spy is not None and index == 0:
                spies.start(_py_spy(task, py_spy / f"{example}_{mode}_{name}{index}.txt"))
        codes = job.wait(job.launched + timeout_s)
        ended = time.monotonic()
    finally:
        job.close()
        spies.wait(time.monotonic() + 30)
        spies.close()
    return _measure(example, mode, steps, job, codes, ended, log_every)


def run_nocomm(example: str, steps: int, timeout_s: float, log_every: int = LOG_EVERY) -> dict:
    """Launch 2 copies of the example's loop with no ps and no exchange (bench/nocomm.py), wait
    for them, and measure them like the workers of a job. Blocks."""
    job = Job(UsageSampler())
    try:
        for index in range(NOCOMM_COPIES):
            argv = ("bench/nocomm.py", "--model", example, "--steps", str(steps), "--replica", str(index),
                    "--replicas", str(NOCOMM_COPIES), "--log_every", str(log_every))
            job.start(Launch(f"worker:{index}", argv, clean_env(os.environ, {}), output=Output.CAPTURE))
        codes = job.wait(job.launched + timeout_s)
        ended = time.monotonic()
    finally:
        job.close()
    return _measure(example, NOCOMM, steps, job, codes, ended, log_every)


def _py_spy(task: Task, out: Path) -> Launch:
    """py-spy sampling `task` until it exits (idle time included, so percentages are of wall time)."""
    out = out.resolve()  # py-spy runs from the repository root
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    program = str(exe) if exe.exists() else shutil.which("py-spy") or "py-spy"
    return Launch(f"py-spy {task.name}", ("record", "-p", str(task.pid), "--idle", "--threads", "--nonblocking",
                                          "-r", "100", "-f", "raw", "-o", str(out)),
                  dict(os.environ), program, Output.DISCARD)


def _measure(example: str, mode: str, steps: int, job: Job, codes: dict, ended: float, log_every: int) -> dict:
    tasks, launched, machine_cpu = job.tasks, job.launched, job.sampler.machine_cpu
    workers = [t for t in tasks if t.name.startswith("worker")]
    times = [progress_times(w) for w in workers]
    ok = all(c == 0 for c in codes.values()) and all(times)
    run: dict = {"example": example, "mode": mode, "steps": steps, "log_every": log_every, "exit_codes": codes,
                 "ok": ok,
                 "wall_s": round(ended - launched, 3),
                 "peak_rss_mb": {t.name: round(t.usage.peak_rss / MB, 1) for t in tasks},
                 "peak_private_mb": {t.name: round(t.usage.peak_private / MB, 1) for t in tasks}}
    if not ok:
        run["error"] = {t.name: t.tail() for t in tasks if codes.get(t.name) != 0 or t in workers}
        return run
    start, end = max(ts[0] for ts in times), min(ts[-1] for ts in times)
    if end <= start:  # one worker was done before the other's first step: no window where both trained
        run["ok"] = False
        run["error"] = {"window": f"the workers never trained at the same time ({steps} steps); give it more steps "
                                  "(--steps, --nocomm-steps)"}
        return run
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
    cpu = {t.name: interpolate(t.usage.cpu, end) - interpolate(t.usage.cpu, start) for t in tasks}
    ours = sum(cpu.values())
    examples = in_window * log_every * BATCH
    window = end - start
    others = interpolate(machine_cpu, end) - interpolate(machine_cpu, start) - ours
    by_job = {job: sum(v for k, v in cpu.items() if k.startswith(job)) for job in ("worker", "ps")}
    run.update({
        "cpu_us_per_example": round(ours / examples * 1e6, 2) if examples else None,
        "cpu_us_per_example_by_job": {job: round(v / examples * 1e6, 2) for job, v in by_job.items()}
        if examples else None,
        "cpu_bound_examples_per_s": round((os.cpu_count() or 1) * examples / ours) if ours > 0 else None,
        "cpu_share_ours": round(ours / (window * (os.cpu_count() or 1)), 2),
        "cpu_share_others": round(max(0.0, others) / (window * (os.cpu_count() or 1)), 2),
        "examples_per_s": round(examples / window),
        "examples_per_s_overall": round(sum(len(ts) for ts in times) * log_every * BATCH / (last_all - first_all)),
        "examples_per_s_self_reported": sum(self_reported),
        "window_s": round(end - start, 3),
        "local_steps": {w.name: len(ts) * log_every for w, ts in zip(workers, times)},
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
        ps_rss = max(max((v for k, v in r["peak_rss_mb"].items() if k.startswith("ps")), default=0) for r in group)
        worker_rss = max(max(v for k, v in r["peak_rss_mb"].items() if k.startswith("worker")) for r in group)
        worker_private = max(max(v for k, v in r["peak_private_mb"].items() if k.startswith("worker")) for r in group)
        ref = REFERENCE_TF1.get(mode) if example == "softmax" else None  # TF was measured on softmax only
        out.append({
            "example": example, "mode": mode, "ok": True, "repeats": len(group),
            "examples_per_s": round(eps), "examples_per_s_all": [r["examples_per_s"] for r in group],
            "examples_per_s_self_reported": round(median([r["examples_per_s_self_reported"] for r in group])),
            "tf1_reference": ref, "ratio_vs_tf1": round(eps / ref, 2) if ref else None,
            "throughput_goal_met": eps >= GOAL_RATIO * ref if ref else None,
            "first_step_s": round(first, 2), "first_step_all": [r["first_step_max_s"] for r in group],
            "first_step_goal_met": first <= GOAL_FIRST_STEP_S if mode != NOCOMM else None,
            "peak_rss_mb_ps": ps_rss, "peak_rss_mb_worker": worker_rss, "peak_private_mb_worker": worker_private,
            "ps_rss_goal_met": ps_rss <= GOAL_PS_RSS_MB if mode != NOCOMM else None,
            "accuracy_min": min(a for r in group for a in r["accuracy"].values() if a is not None),
            "cpu_us_per_example": median([r["cpu_us_per_example"] for r in group]),
            "cpu_us_per_example_worker": median([r["cpu_us_per_example_by_job"]["worker"] for r in group]),
            "cpu_us_per_example_ps": median([r["cpu_us_per_example_by_job"]["ps"] for r in group]),
            "cpu_bound_examples_per_s": round(median([r["cpu_bound_examples_per_s"] for r in group])),
            "cpu_share_others": median([r["cpu_share_others"] for r in group]),
        })
    bound = {row["example"]: row["examples_per_s"] for row in out if row["mode"] == NOCOMM and row["ok"]}
    for row in out:
        if row["ok"] and row["mode"] != NOCOMM and bound.get(row["example"]):
            row["fraction_of_nocomm"] = round(row["examples_per_s"] / bound[row["example"]], 3)
            row["nocomm_goal"] = GOAL_NOCOMM[row["example"]]
            row["nocomm_goal_met"] = row["fraction_of_nocomm"] >= GOAL_NOCOMM[row["example"]]
    return out


def _table(summary: list[dict]) -> str:
    rows = [f"{'example':8} {'mode':13} {'examples/s':>10} {'vs TF1':>7} {'(self)':>8} {'1st step s':>10} "
            f"{'ps RSS MB':>9} {'wk RSS MB':>9} {'wk priv MB':>10} {'acc':>6} {'cpu us/ex':>9} {'w/ps':>11} "
            f"{'cpu-bound/s':>11} {'others':>6} {'/nocomm':>7}  goals (3x TF1 / 1.5 s / ps 100 MB / nocomm "
            f"softmax {GOAL_NOCOMM['softmax']}, mlp {GOAL_NOCOMM['mlp']})"]
    for s in summary:
        if not s["ok"]:
            rows.append(f"{s['example']:8} {s['mode']:13} FAILED (see the JSON 'runs' for the tasks' output)")
            continue
        goals = "/".join({True: "met", False: "MISSED", None: "n/a"}[s.get(k)]
                         for k in ("throughput_goal_met", "first_step_goal_met", "ps_rss_goal_met", "nocomm_goal_met"))
        fraction = f"{s['fraction_of_nocomm']:>7.2f}" if s.get("fraction_of_nocomm") else f"{'':>7}"
        vs_tf1 = f"{s['ratio_vs_tf1']:>6.2f}x" if s["ratio_vs_tf1"] else f"{'n/a':>7}"
        rows.append(f"{s['example']:8} {s['mode']:13} {s['examples_per_s']:>10} {vs_tf1} "
                    f"{s['examples_per_s_self_reported']:>8} {s['first_step_s']:>10.2f} {s['peak_rss_mb_ps']:>9.0f} "
                    f"{s['peak_rss_mb_worker']:>9.0f} {s['peak_private_mb_worker']:>10.0f} {s['accuracy_min']:>6.3f} "
                    f"{s['cpu_us_per_example']:>9.1f} "
                    f"{s['cpu_us_per_example_worker']:>5.1f}/{s['cpu_us_per_example_ps']:<5.1f} "
                    f"{s['cpu_bound_examples_per_s']:>11} {s['cpu_share_others']:>6.2f} {fraction}  {goals}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    parser.add_argument("--examples", default=",".join(EXAMPLES), help=f"comma-separated, of {', '.join(EXAMPLES)}")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help="comma-separated, of async, sync, async-overlap (async with --overlap_push; default: "
                             "async,sync)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--steps", type=int, default=None,
                        help="global steps per run (default: " + ", ".join(f"{k} {v}" for k, v in STEPS.items()) + ")")
    parser.add_argument("--no-nocomm", dest="nocomm", action="store_false",
                        help="leave out the no-communication bound (bench/nocomm.py: the same loop in "
                             f"{NOCOMM_COPIES} processes with no ps, the most these cores can do)")
    parser.add_argument("--nocomm-steps", type=int, default=None,
                        help="local steps per copy of the bound (default: " +
                             ", ".join(f"{k} {v}" for k, v in NOCOMM_STEPS.items()) + ")")
    parser.add_argument("--log-every", type=int, default=LOG_EVERY,
                        help=f"local steps per progress line of the workers and of the bound's copies (default "
                             f"{LOG_EVERY}; each line is a write to a pipe and a wake-up of this process)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record ps:0 and worker:0 of every run with py-spy (raw stacks) into DIR; "
                             "the figures of such runs are slowed by the sampling")
    args = parser.parse_args(argv)
    if args.log_every < 1:
        parser.error(f"--log-every must be 1 or more, got {args.log_every}")
    examples = [e for e in args.examples.split(",") if e]
    modes = [m for m in args.modes.split(",") if m]
    if not set(examples) <= set(EXAMPLES) or not set(modes) <= set(MODE_FLAGS):
        parser.error(f"--examples must be of {', '.join(EXAMPLES)} and --modes of {', '.join(MODE_FLAGS)}")

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
            for mode in modes + ([NOCOMM] if args.nocomm else []):
                if mode == NOCOMM:
                    run = run_nocomm(example, args.nocomm_steps or NOCOMM_STEPS[example], args.timeout,
                                     args.log_every)
                else:
                    run = run_job(example, mode, args.steps or STEPS[example], args.timeout, args.py_spy,
                                  args.log_every)
                run["repeat"] = r
                runs.append(run)
                if run["ok"]:
                    print(f"  {example} {mode} #{r}: {run['examples_per_s']} examples/s, first step "
                          f"{run['first_step_max_s']:.2f} s, wall {run['wall_s']:.1f} s, peak RSS "
                          f"{run['peak_rss_mb']}", flush=True)
                else:
                    why = run.get("error", {}).get("window", f"exit codes {run['exit_codes']}")
                    print(f"  {example} {mode} #{r}: FAILED, {why}", flush=True)
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
