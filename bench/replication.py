"""Shard replication, measured (issue 14): what it costs a job in examples/s, and how soon and with
how many updates lost a killed ps trains again, rebuilt from its successor's replica or from the
newest checkpoint.

    python -m bench.replication [--json] [--quick] [--models softmax,mlp,big] [--every 1,10]
                                [--rounds 2] [--phase-s 20] [--recovery softmax,big]

Real jobs on this machine, async, 2 ps + 2 workers, tasks started as `shoal run` would (TF_CONFIG,
a job secret), ps tasks polled with `status` over a PsClient. Models: softmax
(examples/mnist_softmax.py), mlp (examples/mnist_mlp_torch.py) and big (bench/big_model.py: one
`--big-mib` MiB variable, 64 by default, cut into shards over both ps; a step is the exchange alone).

* cost: one job per model and setting: replication off, and `--replicate_every_secs T` for each T
  of `--every`. Settings run interleaved (off 1 10, then 1 10 off, ...), one job at a time. Once
  ps:0 has applied the model's warm-up steps, examples/s = ps:0's step (in async its count of
  applied pushes, the job's global step) x batch 100 per second over `--phase-s` seconds. `vs
  off`: per round, the setting's examples/s over replication off's in the same round; the
  median over rounds. `replicas`, `copy ms`, `send ms`, `MB`: the replicas both ps logged during
  that window ("ps:0 replicated step N to ps:1: ... copy X ms, send Y ms"; the tasks run with
  SHOAL_LOG_LEVEL=DEBUG, which logs every copy), medians.
* recovery: a job per model and scenario, `replica` (`--replicate_every_secs 1`, checkpoints an
  hour apart) and `checkpoint` (no replication, `--checkpoint_every_secs C`, C = `--ckpt-secs`).
  After `--kill-after-s` seconds of training, ps:1's process group gets SIGKILL and ps:1 is
  started again at once with the same argv and TF_CONFIG (the launcher's restart policy does the
  same after its backoff, 1 s by default, not included here). Figures: seconds from the kill to
  ps:1 answering again, to its being ready (the chief rebuilt it) and to its first applied update
  after the rebuild (its status step passes the step the chief rebuilt it at; polled every 5 ms);
  updates lost = ps:1's step polled just before the kill - the step of the values it was rebuilt
  with (the replica's, or the checkpoint's, from the chief's log). (Workers log no count of their
  own: the step a restored ps answers from does not say how it was restored.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/replication.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fmt, free_ports, machine, median, median_of_present  # noqa: E402
from bench.elastic import wait_step  # noqa: E402
from bench.jobrun import Job, Launch, Output, clean_env  # noqa: E402
from bench.usage import SAMPLE_PERIOD_S, UsageSampler, interpolate  # noqa: E402
from shoal.ps.client import PsClient  # noqa: E402
from shoal.wire import JobSecret, WireError  # noqa: E402

BATCH = 100
POLL_S = 0.005
FOREVER = "100000000"
REPLICATED = re.compile(r"ps:(\d+) replicated step (\d+) to ps:\d+: \d+ tensors, ([\d.]+) kB, copy ([\d.]+) ms, "
                        r"send ([\d.]+) ms")
REBUILT = re.compile(r"rebuilt ps:1 (?:from the replica ps:\d+ holds: step (\d+) .*?, )?at step (\d+)")
FROM_CHECKPOINT = re.compile(r"no usable replica of ps:1: .*; rebuilding it from (?:checkpoint step (\d+)|the chief)")


@dataclass(frozen=True)
class Model:
    """A program the benchmark trains: its path, the ps:0 steps to wait for and its own argv."""

    program: str
    warm_steps: int  # ps:0 steps before a window starts (start-up, first pulls)
    argv: tuple[str, ...]


def models(big_mib: int) -> dict[str, Model]:
    # round robin: the softmax's bias on ps:1 (the greedy placement keeps the whole softmax on ps:0,
    # and an empty ps:1 would replicate nothing and never step); 256 KiB parts: the MLP's first
    # layer cut over both ps, as across hosts (on loopback the whole MLP would sit on ps:0)
    return {"softmax": Model("examples/mnist_softmax.py", 500,
                             ("--log_every", "1000", "--ps_placement", "round_robin")),
            "mlp": Model("examples/mnist_mlp_torch.py", 200, ("--log_every", "1000", "--push_part_bytes", "262144")),
            "big": Model("bench/big_model.py", 4, ("--log_every", "50", "--mib", str(big_mib)))}


class Cluster:
    """2 ps + 2 workers of one model: addresses, secret, tasks (a bench Job)."""

    def __init__(self, model: Model, argv: list[str], sampler: UsageSampler | None = None) -> None:
        ports = free_ports(4)
        self.spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
        self.secret = secrets.token_hex(16)
        self.argv = (model.program, *model.argv, "--steps", FOREVER, *argv)
        self.job = Job(sampler)

    def start(self, job: str, index: int, name: str | None = None) -> None:
        tf_config = json.dumps({"cluster": self.spec, "task": {"type": job, "index": index}})
        env = clean_env(os.environ, {"TF_CONFIG": tf_config, "SHOAL_JOB_SECRET": self.secret,
                                       "SHOAL_LOG_LEVEL": "DEBUG"})
        self.job.start(Launch(name or f"{job}:{index}", self.argv, env, output=Output.CAPTURE))

    def start_all(self) -> None:
        for job, index in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)):
            self.start(job, index)

    def client(self) -> PsClient:
        return PsClient(self.spec["ps"], JobSecret(self.secret.encode(), "bench"), timeout_s=10)

    def lines(self, since: float, names: tuple[str, ...]) -> list[str]:
        """The named tasks' output lines that arrived at or after monotonic time `since`."""
        return [line for name in names for t, line in list(self.job.task(name).lines) if t >= since]

    def check_alive(self) -> None:
        """Raise RuntimeError, with its output's tail, if a task has ended."""
        ended = {name: code for name, code in self.job.poll().items() if code is not None}
        if ended:
            name = next(iter(ended))
            raise RuntimeError(f"{name} ended early (exit {ended[name]}):\n{self.job.task(name).tail(30)}")


def cost(name: str, model: Model, every_s: float | None, phase_s: float) -> dict:
    """One job at one replication setting: examples/s over `phase_s`, CPU per example and the
    replicas sent. Blocks."""
    sampler = UsageSampler()
    cluster = Cluster(model, ["--replicate_every_secs", f"{every_s:g}"] if every_s else [], sampler)
    client = cluster.client()
    try:
        cluster.start_all()
        wait_step(client, model.warm_steps, 300, ps=0, check=cluster.check_alive)
        first, t0 = client.status(0, 5.0).step, time.monotonic()
        time.sleep(phase_s)
        last, t1 = client.status(0, 5.0).step, time.monotonic()
        cluster.check_alive()
        time.sleep(3 * SAMPLE_PERIOD_S)  # a CPU sample after the window
        replicas = [REPLICATED.search(line) for line in cluster.lines(t0, ("ps:0", "ps:1"))]
        replicas = [m for m in replicas if m and float(m.group(2)) > 0]
    finally:
        client.close()
        cluster.job.close()
    examples, window, cores = (last - first) * BATCH, t1 - t0, os.cpu_count() or 1
    # CPU per example hardly depends on what else the machine runs, unlike examples/s
    cpu = {t.name: interpolate(t.usage.cpu, t1) - interpolate(t.usage.cpu, t0) for t in cluster.job.tasks}
    ours = sum(cpu.values())
    ps_cpu = sum(v for k, v in cpu.items() if k.startswith("ps"))
    others = interpolate(sampler.machine_cpu, t1) - interpolate(sampler.machine_cpu, t0) - ours
    return {"model": name, "every_s": every_s, "examples_per_s": round(examples / window),
            "window_s": round(window, 2), "replicas": len(replicas),
            "copy_ms": round(median([float(m.group(4)) for m in replicas]), 2) if replicas else None,
            "send_ms": round(median([float(m.group(5)) for m in replicas]), 1) if replicas else None,
            "replica_mb": round(median([float(m.group(3)) for m in replicas]) / 1e3, 2) if replicas else None,
            "cpu_us_per_example": round(ours / examples * 1e6, 2) if examples else None,
            "cpu_us_per_example_ps": round(ps_cpu / examples * 1e6, 2) if examples else None,
            "cpu_share_others": round(max(0.0, others) / (window * cores), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def recovery(name: str, model: Model, scenario: str, kill_after_s: float, ckpt_secs: float) -> dict:
    """Kill ps:1 with SIGKILL mid-training and start it again; time its way back. Blocks."""
    with tempfile.TemporaryDirectory(prefix="bench-replication-") as model_dir:
        if scenario == "replica":
            argv = ["--replicate_every_secs", "1", "--model_dir", model_dir, "--checkpoint_every_secs", "3600"]
        else:
            argv = ["--model_dir", model_dir, "--checkpoint_every_secs", f"{ckpt_secs:g}"]
        cluster = Cluster(model, argv)
        client = cluster.client()
        try:
            cluster.start_all()
            wait_step(client, model.warm_steps, 300, ps=1, check=cluster.check_alive)
            time.sleep(kill_after_s)
            cluster.check_alive()
            before = client.status(1, 5.0).step
            victim = cluster.job.task("ps:1")
            os.killpg(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            victim.proc.wait(10)
            cluster.start("ps", 1, name="ps:1 (restarted)")
            result = _time_recovery(cluster, client, killed)
        finally:
            client.close()
            cluster.job.close()
    values_step = result.pop("values_step")
    return {"model": name, "scenario": scenario, "flags": " ".join(argv).replace(model_dir, "DIR"),
            "trained_s_before_kill": kill_after_s, "step_before_kill": before, "rebuilt_with_step": values_step,
            "updates_lost": before - values_step if values_step is not None else None,
            **result,
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def _time_recovery(cluster: Cluster, client: PsClient, killed: float) -> dict:
    """Poll ps:1 until it applied an update after its rebuild. Blocks (bounded)."""
    deadline = killed + 180
    answered = ready = None
    samples: list[tuple[float, int]] = []  # (time, ps:1's step) once ready
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ps:1 applied no update within 180 s of its restart:\n"
                               f"{cluster.job.task('worker:0').tail(30)}")
        try:
            status = client.status(1, 0.5)
        except WireError:
            status = None
        now = time.monotonic()
        if status is not None:
            answered = answered or now
            if status.ready:
                ready = ready or now
                samples.append((now, status.step))
        chief = cluster.lines(killed, ("worker:0",))
        rebuilt = next((m for line in chief if (m := REBUILT.search(line))), None)
        if rebuilt is not None and any(step > int(rebuilt.group(2)) for _, step in samples):
            break
        time.sleep(POLL_S)
    at_step = int(rebuilt.group(2))
    if rebuilt.group(1) is not None:
        source, values_step = "replica", int(rebuilt.group(1))
    else:
        fallback = next((m for line in chief if (m := FROM_CHECKPOINT.search(line))), None)
        source = "checkpoint" if fallback and fallback.group(1) else "chief's copy"
        values_step = int(fallback.group(1)) if fallback and fallback.group(1) else None
    applied = min(t for t, step in samples if step > at_step)
    return {"source": source, "values_step": values_step, "restarted_at_step": at_step,
            "kill_to_answer_s": round(answered - killed, 3), "kill_to_ready_s": round(ready - killed, 3),
            "kill_to_first_applied_s": round(applied - killed, 3)}


def summarize(runs: list[dict]) -> list[dict]:
    """Per model and setting: median examples/s, and the median over rounds of the ratio to
    replication off in the same round."""
    rows = []
    for name in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == name]
        off = {r["round"]: r["examples_per_s"] for r in mine if r["every_s"] is None}
        cpu_off = {r["round"]: r["cpu_us_per_example"] for r in mine if r["every_s"] is None}
        for every in dict.fromkeys(r["every_s"] for r in mine):
            same = [r for r in mine if r["every_s"] == every]
            ratios = [r["examples_per_s"] / off[r["round"]] for r in same if off.get(r["round"])]
            cpu_ratios = [r["cpu_us_per_example"] / cpu_off[r["round"]] for r in same
                          if cpu_off.get(r["round"]) and r["cpu_us_per_example"]]
            present = [r for r in same if r["replicas"]]
            rows.append({"model": name, "every_s": every, "examples_per_s": round(median([r["examples_per_s"] for r in same])),
                         "vs_off": round(median(ratios), 3) if ratios else None,
                         "cpu_us_per_example": median_of_present(r["cpu_us_per_example"] for r in same),
                         "cpu_us_per_example_ps": median_of_present(r["cpu_us_per_example_ps"] for r in same),
                         "cpu_vs_off": round(median(cpu_ratios), 3) if cpu_ratios else None,
                         "cpu_share_others": median([r["cpu_share_others"] for r in same]),
                         "replicas_per_window": median([r["replicas"] for r in same]),
                         "copy_ms": median([r["copy_ms"] for r in present]) if present else None,
                         "send_ms": median([r["send_ms"] for r in present]) if present else None,
                         "replica_mb": median([r["replica_mb"] for r in present]) if present else None,
                         "rounds": len(same)})
    return rows


def _csv(text: str, kind=str) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="softmax,mlp,big", help="cost: models (softmax, mlp, big); '' for none")
    parser.add_argument("--every", default="1,10", help="cost: --replicate_every_secs values next to off")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--phase-s", type=float, default=20.0, help="cost: seconds measured per job")
    parser.add_argument("--big-mib", type=int, default=64, help="size of the big model's variable")
    parser.add_argument("--recovery", default="softmax,big", help="recovery: models; '' for none")
    parser.add_argument("--kill-after-s", type=float, default=15.0, help="recovery: seconds trained before the kill")
    parser.add_argument("--ckpt-secs", type=float, default=10.0, help="recovery: --checkpoint_every_secs without replication")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 round, --every 1, 3 s windows, an 8 MiB big model, kill after 3 s, "
                             "checkpoints every 2 s")
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.every, args.phase_s, args.big_mib, args.kill_after_s, args.ckpt_secs = 1, "1", 3.0, 8, 3.0, 2.0
    catalog = models(args.big_mib)
    cost_models, recovery_models = _csv(args.models), _csv(args.recovery)
    unknown = sorted(set(cost_models + recovery_models) - set(catalog))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(catalog)}")
    if {"softmax", "mlp"} & set(cost_models + recovery_models):
        from shoal.datasets.mnist import default_cache_dir, load_mnist
        load_mnist(default_cache_dir(os.environ))  # build the .npy cache now, so no run pays for it
    settings: list[float | None] = [None, *_csv(args.every, float)]
    results: dict = {"machine": machine(), "big_mib": args.big_mib, "phase_s": args.phase_s, "runs": []}
    for round_ in range(args.rounds):
        for name in cost_models:
            for every in settings[round_ % len(settings):] + settings[:round_ % len(settings)]:
                run = {"round": round_, **cost(name, catalog[name], every, args.phase_s)}
                results["runs"].append(run)
                print(f"round {round_} {name:8} every {fmt(every, 'g'):>3}s: {run['examples_per_s']:>8} examples/s, "
                      f"{fmt(run['cpu_us_per_example'])} CPU us/ex, {run['replicas']} replicas (others "
                      f"{run['cpu_share_others']:.2f} of the cores, load {run['loadavg_1m']})", flush=True)
    results["summary"] = summarize(results["runs"]) if results["runs"] else []
    results["recovery"] = []
    for name in recovery_models:
        for scenario in ("replica", "checkpoint"):
            results["recovery"].append(recovery(name, catalog[name], scenario, args.kill_after_s, args.ckpt_secs))
    results["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)

    if results["summary"]:
        print(f"\n{'model':8} {'replication':>11} {'examples/s':>10} {'vs off':>7} {'CPU us/ex':>9} {'ps part':>7} "
              f"{'CPU vs off':>10} {'others':>6} {'replicas':>8} {'copy ms':>8} {'send ms':>8} {'MB':>6}")
    for row in results["summary"]:
        every = "off" if row["every_s"] is None else f"{row['every_s']:g} s"
        print(f"{row['model']:8} {every:>11} {row['examples_per_s']:>10} {fmt(row['vs_off'], '.3f'):>7} "
              f"{fmt(row['cpu_us_per_example'], '.1f'):>9} {fmt(row['cpu_us_per_example_ps'], '.1f'):>7} "
              f"{fmt(row['cpu_vs_off'], '.3f'):>10} {row['cpu_share_others']:>6.2f} {row['replicas_per_window']:>8g} "
              f"{fmt(row['copy_ms'], '.2f'):>8} {fmt(row['send_ms'], '.1f'):>8} {fmt(row['replica_mb'], '.2f'):>6}")
    if results["recovery"]:
        print(f"\n{'model':8} {'scenario':10} {'source':10} {'answer s':>8} {'ready s':>8} {'applied s':>9} "
              f"{'lost':>6}")
    for r in results["recovery"]:
        print(f"{r['model']:8} {r['scenario']:10} {r['source']:10} {r['kill_to_answer_s']:>8.3f} "
              f"{r['kill_to_ready_s']:>8.3f} {r['kill_to_first_applied_s']:>9.3f} {fmt(r['updates_lost']):>6}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
