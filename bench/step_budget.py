"""CPU per training step, by process, with each process alone on a core: where the examples'
CPU goes beyond the no-communication bound's loop.

    python -m bench.step_budget                      # softmax: async, async-overlap; leased, static
    python -m bench.step_budget --examples softmax,mlp --json

bench.mnist_throughput reports Shoal's examples/s as a fraction of the no-communication bound,
with 4 processes (2 ps + 2 workers) sharing 2 cores. In that run, the fraction is the CPU ratio
(the bound's CPU per example over Shoal's, worker + ps) times Shoal's busy share over the
bound's (`examples/s` over `cpu-bound/s`: how much of the cores each keeps busy). This
benchmark measures the first without the contention: the CPU ratio of a step with the cores to
spare, which the job's own (4 tasks on 2 cores: caches cold, a core switched between tasks)
falls below (bench/README.md: softmax 0.36 in the job, 0.47 here).

Here 1 ps and 1 worker run the example (2 processes, 2 cores: neither waits for a core on a
quiet machine; the load average is printed at the start), and 1
copy of bench/nocomm.py runs the bound's loop. Each runs twice, for `--base-steps` and for
`--steps` steps; a process's CPU per step is the difference of its CPU (user + system, sampled
as bench/usage.py defines) over the difference of the steps, so start-up (imports, loading
MNIST, connecting) drops out. Configurations run interleaved, `--repeats` times, medians.

Columns: `worker` and `ps` (us of CPU per step), `total`, `bound` (the bound's loop, us per
step), `cpu ratio` = bound / total. `leased` is the examples' default (batches leased from ps 0,
docs/dynamic-sharding.md); `static` (`--sharding static`, softmax only) reads a fixed shard per
worker: their difference is what the lease accounting costs.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys

from bench import free_ports, machine, median
from bench.example_modes import MODE_FLAGS
from bench.jobrun import Job, Launch, Output, clean_env
from bench.usage import UsageSampler

EXAMPLES = {"softmax": "examples/mnist_softmax.py", "mlp": "examples/mnist_mlp_torch.py"}
STEPS = {"softmax": 20000, "mlp": 6000}
BASE_STEPS = {"softmax": 2000, "mlp": 1000}  # (torch imports in 1.5 +- 0.2 s: the MLP needs long runs)
SHARDINGS = {"leased": [], "static": ["--sharding", "static"]}
STATIC_EXAMPLES = ("softmax",)  # the examples with a --sharding flag


def cpu_of(job: Job) -> dict[str, float]:
    """Each task's CPU seconds at its last sample (read after `job.close()`). Up to one sample
    period (50 ms) of CPU before each exit is missed, at random in each run: +-3 us per softmax
    step and +-10 per MLP step in the difference of two runs at the default steps."""
    return {task.name: task.usage.cpu[-1][1] if task.usage.cpu else 0.0 for task in job.tasks}


def run_shoal(example: str, mode: str, sharding: str, steps: int, timeout_s: float) -> dict[str, float]:
    """1 ps + 1 worker of `example` for `steps` steps; each task's CPU seconds. Blocks."""
    ports = free_ports(2)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    secret = secrets.token_hex(16)
    argv = (EXAMPLES[example], "--steps", str(steps), "--log_every", str(steps + 1), *MODE_FLAGS[mode],
            *SHARDINGS[sharding])
    job = Job(UsageSampler())
    try:
        for role in ("ps", "worker"):
            tf_config = json.dumps({"cluster": spec, "task": {"type": role, "index": 0}})
            env = clean_env(os.environ, {"TF_CONFIG": tf_config, "SHOAL_JOB_SECRET": secret})
            job.start(Launch(role, argv, env, output=Output.CAPTURE))
        codes = job.wait(job.launched + timeout_s, until_failure=True)
    finally:
        job.close()
    _check(job, codes)
    return cpu_of(job)


def run_bound(example: str, steps: int, timeout_s: float) -> dict[str, float]:
    """One copy of the bound's loop (bench/nocomm.py) for `steps` steps; its CPU seconds. Blocks."""
    job = Job(UsageSampler())
    try:
        argv = ("bench/nocomm.py", "--model", example, "--steps", str(steps), "--replica", "0", "--replicas", "1",
                "--log_every", str(steps + 1))  # no progress line, as the job's tasks
        job.start(Launch("bound", argv, clean_env(os.environ, {}), output=Output.CAPTURE))
        codes = job.wait(job.launched + timeout_s, until_failure=True)
    finally:
        job.close()
    _check(job, codes)
    return cpu_of(job)


def _check(job: Job, codes: dict) -> None:
    """SystemExit naming the first task that did not exit 0 (after `job.close()`), with its last lines."""
    for name, code in codes.items():
        if code != 0:
            how = "ran past the --timeout" if code is None else f"exited {code}"
            raise SystemExit(f"step_budget: {name} {how}; its last lines:\n{job.task(name).tail()}")


def per_step(short: dict[str, float], long: dict[str, float], steps: int) -> dict[str, float]:
    """us of CPU per step of each task: the difference of two runs over the difference of steps."""
    return {name: (long[name] - short[name]) / steps * 1e6 for name in long}


def steps_of(args: argparse.Namespace, example: str) -> tuple[int, int]:
    """(long, short) steps of `example`'s runs: the command line's, else the example's defaults."""
    return (args.steps if args.steps is not None else STEPS[example],
            args.base_steps if args.base_steps is not None else BASE_STEPS[example])


def configurations(examples: list[str], modes: list[str]) -> list[tuple[str, str, str]]:
    return [(example, mode, sharding) for example in examples for mode in modes for sharding in SHARDINGS
            if sharding == "leased" or example in STATIC_EXAMPLES]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="softmax", help="comma-separated, of softmax, mlp")
    parser.add_argument("--modes", default="async,async-overlap",
                        help=f"comma-separated, of {', '.join(MODE_FLAGS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int,
                        help="steps of the long run, for every example given (default: softmax 20000, mlp 6000)")
    parser.add_argument("--base-steps", type=int,
                        help="steps of the short run, for every example given (default: softmax 2000, mlp 1000)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    args = parser.parse_args(argv)
    examples = args.examples.split(",")
    modes = args.modes.split(",")
    for name, given, known in (("example", examples, EXAMPLES), ("mode", modes, MODE_FLAGS)):
        unknown = [g for g in given if g not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown[0]!r}; choose from {', '.join(known)}")
    for example in examples:
        long_steps, short_steps = steps_of(args, example)
        if not 0 < short_steps < long_steps:
            parser.error(f"{example}: --base-steps ({short_steps}) must be at least 1 and fewer than --steps "
                         f"({long_steps}): the CPU per step is the difference of the two runs")
    print(f"step_budget: 1 ps + 1 worker, and the bound's loop alone; {args.repeats} repeats, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}", flush=True)
    samples: dict[tuple, list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for example in examples:
            long_steps, short_steps = steps_of(args, example)
            short, long = run_bound(example, short_steps, args.timeout), run_bound(example, long_steps, args.timeout)
            samples.setdefault((example, "bound", ""), []).append(per_step(short, long, long_steps - short_steps))
            for config in configurations([example], modes):
                short = run_shoal(*config, short_steps, args.timeout)
                long = run_shoal(*config, long_steps, args.timeout)
                step = per_step(short, long, long_steps - short_steps)
                samples.setdefault(config, []).append(step)
                print(f"  {' '.join(config)} #{repeat}: worker {step['worker']:.1f}, ps {step['ps']:.1f} us/step",
                      flush=True)
    rows = []
    for example in examples:
        bound = median([s["bound"] for s in samples[(example, "bound", "")]])
        for config in configurations([example], modes):
            worker = median([s["worker"] for s in samples[config]])
            ps = median([s["ps"] for s in samples[config]])
            rows.append({"example": example, "mode": config[1], "sharding": config[2], "worker_us": round(worker, 1),
                         "ps_us": round(ps, 1), "total_us": round(worker + ps, 1), "bound_us": round(bound, 1),
                         "cpu_ratio": round(bound / (worker + ps), 3)})
    print(f"{'example':8} {'mode':14} {'sharding':8} {'worker':>7} {'ps':>6} {'total':>7} {'bound':>6} "
          f"{'cpu ratio':>9}")
    for r in rows:
        print(f"{r['example']:8} {r['mode']:14} {r['sharding']:8} {r['worker_us']:7.1f} {r['ps_us']:6.1f} "
              f"{r['total_us']:7.1f} {r['bound_us']:6.1f} {r['cpu_ratio']:9.3f}")
    if args.json:
        print(json.dumps({"machine": machine(), "repeats": args.repeats, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
