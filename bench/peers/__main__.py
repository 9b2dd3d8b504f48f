"""Shoal side by side with TensorFlow and PyTorch, on this machine, in one run.

    python -m bench.peers                 # full: 3 interleaved rounds, ~25 min on 2 cores
    python -m bench.peers --quick --json  # 1 round, shorter runs, ~5 min; last line is JSON
    python -m bench.peers --dry-run       # print every job's tasks, run nothing

Runs Shoal async and sync (examples/mnist_softmax.py, examples/mnist_mlp_torch.py, unchanged)
next to each peer program of bench/peers/ in adjacent runs (Shoal, peer, Shoal, peer, ...;
the pairs rotate and swap order every round), so the machine's drift hits both sides of a
ratio alike. Then Shoal alone with 1, 2 and 4 workers. Writes JSON, a markdown table and a
PNG under bench/results/. The peers run in bench/.peers-venv, created on first use.
See bench/README.md ("peers") for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import REPO, machine
from bench.peers import ladder, metrics, report, systems
from bench.peers.runner import run_job

RESULTS = REPO / "bench" / "results"
SHOAL = ("shoal-async", "shoal-sync")


@dataclass(frozen=True)
class Plan:
    rounds: int
    examples: dict = field(default_factory=dict)  # per model, per run
    max_seconds: float = 20.0                     # TF1 / TF2 PS stop this long after their first step
    timeout_s: float = 240.0                      # one run
    scaling_rounds: int = 2
    scaling_examples: int = 200_000
    scaling_workers: tuple = (1, 2, 4)
    ladder_max_examples: int = 400_000
    ladder_stride: int = 5_000                    # examples: S90's resolution (the peers evaluate this often)


FULL = Plan(rounds=3, examples={"softmax": 240_000, "mlp": 160_000})
QUICK = Plan(rounds=1, examples={"softmax": 60_000, "mlp": 80_000}, max_seconds=8.0, timeout_s=120.0,
             scaling_rounds=1, scaling_examples=60_000, ladder_stride=10_000)


def pair_sequence(selected: list[str], round_: int, model: str | None = None) -> list[tuple[str | None, str | None]]:
    """This round's (Shoal system, reference) pairs among the selected systems that train `model`
    (None: any): every selected peer next to the Shoal system it is compared with, every Shoal
    system next to its own references (systems.pairs), rotated by the round; a system in no
    pair runs alone."""
    pairs = systems.pairs(selected, model)
    shift = round_ % len(pairs) if pairs else 0
    return pairs[shift:] + pairs[:shift]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of short runs (a few minutes)")
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    parser.add_argument("--systems", default=",".join(systems.SYSTEMS), help="comma-separated subset")
    parser.add_argument("--models", default=",".join(systems.MODELS), help="comma-separated: softmax, mlp")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: 3, --quick 1)")
    parser.add_argument("--examples", type=int, help="examples per run, every model (default: per model)")
    parser.add_argument("--no-ladder", action="store_true", help="skip Shoal's runs that find its steps to 0.90")
    parser.add_argument("--no-scaling", action="store_true", help="skip Shoal with 1, 2, 4 workers")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--dry-run", action="store_true", help="print the jobs of one round and exit")
    args = parser.parse_args(argv)
    selected = [s for s in args.systems.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    if not set(selected) <= set(systems.SYSTEMS) or not set(models) <= set(systems.MODELS):
        parser.error(f"--systems must be of {', '.join(systems.SYSTEMS)}; --models of {', '.join(systems.MODELS)}")
    plan = QUICK if args.quick else FULL
    rounds = args.rounds or plan.rounds
    examples = {m: args.examples or plan.examples[m] for m in models}

    from shoal.datasets.mnist import default_cache_dir, load_mnist
    load_mnist(default_cache_dir(os.environ))  # the .npy cache every system reads, built before anything is timed
    peers_python = None
    if any(systems.SYSTEMS[s].peer and systems.SYSTEMS[s].venv for s in selected) and not args.dry_run:
        from bench.peers.venv import ensure_peers_venv
        peers_python = str(ensure_peers_venv())
    elif args.dry_run:
        from bench.peers.venv import peers_python as venv_python
        peers_python = str(venv_python())
    ctx = systems.Context(sys.executable, peers_python, str(default_cache_dir(os.environ)), plan.max_seconds)
    if args.dry_run:
        for pairs_model in models:
            for pair in pair_sequence(selected, 0, pairs_model):
                for name in filter(None, pair):
                    spec = systems.build(systems.SYSTEMS[name], pairs_model, examples[pairs_model], ctx)
                    print(f"# {name} {pairs_model}: {spec.steps} global steps\n{spec.describe()}")
        return 0

    started = time.monotonic()
    info = machine()
    print(f"bench.peers: {', '.join(selected)}; {', '.join(models)}; {rounds} rounds; {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    ladders: dict[str, dict] = {}
    if not args.no_ladder:
        print("Shoal's steps to 0.90 (runs of fixed length):", flush=True)
        for model in models:
            for name in (s for s in SHOAL if s in selected):
                ladders[f"{name}/{model}"] = ladder.find_s90(
                    systems.SYSTEMS[name], model, ctx, plan.ladder_stride, plan.timeout_s, plan.ladder_max_examples,
                    log=lambda line: print(line, flush=True))

    runs: list[dict] = []
    pairs: list[dict] = []

    def run_one(name: str, model: str, phase: str, round_: int, n_examples: int, workers: int = 2) -> int:
        system = systems.SYSTEMS[name]
        spec = systems.build(system, model, n_examples, ctx, workers=workers)
        found = ladders.get(f"{name}/{model}") if not system.peer and workers == 2 else None
        record = run_job(spec, plan.timeout_s)
        run = metrics.measure(record, s90=found["s90"] if found else None,
                              ladder_points=found["points"] if found else ())
        if found is not None and found["s90"] is None:
            run["time_to_090_s"] = None
        run.update(phase=phase, round=round_, workers=workers)
        runs.append(run)
        if run["ok"]:
            print(f"  [{phase} {round_}] {name:11} {model:7} w={workers}: {run['examples_per_s']:>7,} ex/s, "
                  f"first step {run['first_step_s']:.2f} s, to 0.90 {run['time_to_090_s']} s, "
                  f"CPU {run['cpu_s_per_1k_examples']} s/1k, ps {run['peak_rss_mb_ps']} MB, "
                  f"others {run['cpu_share_others']}, acc {run['accuracy']}", flush=True)
        else:
            print(f"  [{phase} {round_}] {name} {model}: FAILED, exit codes {run['exit_codes']}"
                  f"{' (timed out)' if run['timed_out'] else ''}", flush=True)
        return len(runs) - 1

    for round_ in range(rounds):
        for model in models:
            for i, (shoal, peer) in enumerate(pair_sequence(selected, round_, model)):
                order = [shoal, peer] if (round_ + i) % 2 == 0 else [peer, shoal]
                index = {name: run_one(name, model, "compare", round_, examples[model]) for name in order if name}
                if shoal and peer:
                    pairs.append({"round": round_, "model": model, "shoal": index[shoal], "peer": index[peer]})

    if not args.no_scaling and any(s in selected for s in SHOAL):
        workers = list(plan.scaling_workers)
        for round_ in range(plan.scaling_rounds):
            shift = round_ % len(workers)
            for n in workers[shift:] + workers[:shift]:
                for name in (s for s in SHOAL if s in selected):
                    run_one(name, "softmax", "scaling", round_, plan.scaling_examples, workers=n)

    summary = report.summarize(runs)
    ratio_rows = report.ratios(runs, pairs)
    rss_rows = report.rss_goal(summary)
    scaling_rows = report.scaling(runs)
    table = report.markdown(summary, ratio_rows, rss_rows, scaling_rows, ladders, info)
    result = {"results": summary, "ratios": ratio_rows, "ps_rss": rss_rows, "scaling": scaling_rows,
              "ladder": ladders, "pairs": pairs, "runs": runs, "machine": info,
              "plan": {"rounds": rounds, "examples": examples, "quick": args.quick,
                       "max_seconds": plan.max_seconds, "warmup_share": metrics.WARMUP},
              "bench_wall_s": round(time.monotonic() - started, 1)}
    files = _write(result, table, args.out, plot=not args.no_plot)
    print(table, flush=True)
    for path in files:
        print(f"wrote {path}", flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0 if summary and all(s.get("ok_runs") for s in summary) else 1


def _write(result: dict, table: str, out: Path, plot: bool) -> list[Path]:
    """JSON and markdown, stamped and as `peers.*` (the latest); the PNG when the peers' venv
    can draw it. Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    written = []
    for name in (f"peers-{stamp}", "peers"):
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        (out / f"{name}.md").write_text(table)
        written += [out / f"{name}.json", out / f"{name}.md"]
    if plot:
        from bench.peers.venv import missing_modules, peers_python
        if "matplotlib" in missing_modules():
            print("no plot: the peers' virtualenv (bench/.peers-venv) has no matplotlib; run with a peer "
                  "system once to create it", flush=True)
        else:
            png = out / "peers.png"
            done = subprocess.run([str(peers_python()), str(REPO / "bench" / "peers" / "plot.py"),
                                   str(out / "peers.json"), str(png)], capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                written.append(png)
            else:
                print(f"no plot: plot.py failed:\n{done.stderr[-2000:]}", flush=True)
    return written


if __name__ == "__main__":
    sys.exit(main())
