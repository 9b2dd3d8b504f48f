"""Elastic training, measured (issue 13): how long a sync job waits for a dead worker, how soon a
joining worker trains, and examples/s before, during and after the job grows and shrinks.

    python -m bench.elastic [--json] [--heartbeat 3] [--phase-s 10]

Two real jobs of examples/mnist_softmax.py on this machine (tasks started as `shoal run` would,
with TF_CONFIG; ps:0 is polled with `status` every 20 ms):

* death: sync, 1 ps + 3 workers, `--heartbeat_timeout H`; worker:2 gets SIGKILL mid-training.
  Figure: seconds from the kill to the completion of the first sync step that cannot have its
  gradient (the one after the step in flight), next to H (the floor: the ps
  must wait that long before it may call the worker dead) — the rest is one step plus the
  detection granularity.
* rescale: async, 1 ps + 2 workers for a phase, then worker:2 and worker:3 join (started with a
  TF_CONFIG that names them; nobody else restarts) for a phase, then leave (SIGTERM) for a
  phase. Figures: seconds from the joiners' start to the ps counting the first of them (membership)
  and to the first applied gradient of either (its first progress line; includes starting Python and loading MNIST),
  and the job's examples/s (ps:0's global step x batch 100 per second) in each phase. On a
  machine with fewer cores than tasks, more workers cannot mean more examples/s: read the
  phases as "nothing stalls", and compare on a machine with cores to spare.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as `python bench/elastic.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import free_ports, machine  # noqa: E402
from bench.jobrun import Job, Launch, Output, clean_env  # noqa: E402
from shoal.ps.client import PsClient  # noqa: E402
from shoal.wire import JobSecret, WireError  # noqa: E402

EXAMPLE = "examples/mnist_softmax.py"
BATCH = 100
POLL_S = 0.02


class Cluster:
    """A job's addresses and secret; starts its tasks into a bench Job."""

    def __init__(self, workers: int) -> None:
        ports = free_ports(1 + workers + 2)
        self.ps = [f"127.0.0.1:{ports[0]}"]
        self.workers = [f"127.0.0.1:{p}" for p in ports[1:]]
        self.secret = secrets.token_hex(16)
        self.job = Job()

    def start(self, job: str, index: int, argv: list[str], workers: int) -> None:
        spec = {"ps": self.ps, "worker": self.workers[:workers]}
        tf_config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
        env = clean_env(os.environ, {"TF_CONFIG": tf_config, "SHOAL_JOB_SECRET": self.secret})
        self.job.start(Launch(f"{job}:{index}", (EXAMPLE, *argv), env, output=Output.CAPTURE))

    def client(self) -> PsClient:
        return PsClient(self.ps, JobSecret(self.secret.encode(), "bench"), timeout_s=10)


def wait_step(client: PsClient, at_least: int, timeout_s: float, *, ps: int = 0,
              check: Callable[[], None] | None = None) -> int:
    """Poll ps `ps`'s status until its step reaches `at_least`; returns that step. `check`, if
    given, runs before each poll (raise there to stop waiting: a task ended early).
    RuntimeError after `timeout_s`. Blocks."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        try:
            step = client.status(ps, 5.0).step
        except WireError:
            step = -1
        if step >= at_least:
            return step
        if time.monotonic() > deadline:
            raise RuntimeError(f"ps:{ps} did not reach step {at_least} within {timeout_s}s")
        time.sleep(0.1)


def death(heartbeat_s: float) -> dict:
    """Sync, 3 workers: SIGKILL worker:2, time until the next completed step. Blocks."""
    cluster = Cluster(3)
    argv = ["--sync", "--steps", "100000000", "--log_every", "1000", "--heartbeat_timeout", str(heartbeat_s)]
    client = cluster.client()
    try:
        cluster.start("ps", 0, argv, 3)
        for i in range(3):
            cluster.start("worker", i, argv, 3)
        wait_step(client, 500, 120)
        victim = cluster.job.task("worker:2")
        os.killpg(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        # the step in flight may complete with worker:2's gradient (it pushed before it died);
        # the next one cannot: it completes only once the ps dropped worker:2
        step = client.status(0, 5.0).step
        while client.status(0, 5.0).step <= step + 1:
            if time.monotonic() - killed > 10 * heartbeat_s + 30:
                raise RuntimeError("no sync step completed after the kill")
            time.sleep(POLL_S)
        waited = time.monotonic() - killed
    finally:
        client.close()
        cluster.job.close()
    return {"heartbeat_timeout_s": heartbeat_s, "death_to_next_step_s": round(waited, 3),
            "beyond_heartbeat_s": round(waited - heartbeat_s, 3)}


def _rate(client: PsClient, seconds: float) -> float:
    """The job's examples/s over the next `seconds` (ps:0's step x batch)."""
    first, t0 = client.status(0, 5.0).step, time.monotonic()
    time.sleep(seconds)
    last, t1 = client.status(0, 5.0).step, time.monotonic()
    return (last - first) * BATCH / (t1 - t0)


def rescale(phase_s: float) -> dict:
    """Async: 2 workers, then 4, then 2 again. Blocks."""
    cluster = Cluster(4)
    argv = ["--steps", "100000000", "--log_every", "1"]
    client = cluster.client()
    result: dict = {}
    try:
        cluster.start("ps", 0, argv, 2)
        for i in range(2):
            cluster.start("worker", i, argv, 2)
        wait_step(client, 200, 120)
        result["examples_per_s_2_workers"] = round(_rate(client, phase_s))
        started = time.monotonic()
        for i in (2, 3):
            cluster.start("worker", i, argv, 4)
        joined = first_applied = None
        during_from = client.status(0, 5.0).step
        while joined is None or first_applied is None:
            if time.monotonic() - started > 120:
                raise RuntimeError("the joining workers did not train within 120 s")
            if joined is None and {"worker:2", "worker:3"} & set(client.status(0, 5.0).members):
                joined = time.monotonic() - started
            lines = [t for name in ("worker:2", "worker:3") for t, line in cluster.job.task(name).lines
                     if " step=" in line]
            if first_applied is None and len(lines) >= 1:
                first_applied = min(lines) - started
            time.sleep(POLL_S)
        during = (client.status(0, 5.0).step - during_from) * BATCH / (time.monotonic() - started)
        result.update(join_to_member_s=round(joined, 3), join_to_first_applied_s=round(first_applied, 3),
                      examples_per_s_while_joining=round(during))
        result["examples_per_s_4_workers"] = round(_rate(client, phase_s))
        for i in (2, 3):
            os.killpg(cluster.job.task(f"worker:{i}").pid, signal.SIGTERM)
        cluster.job.wait(time.monotonic() + 30, names=["worker:2", "worker:3"])
        result["left_members"] = list(client.status(0, 5.0).members)
        result["examples_per_s_2_workers_after"] = round(_rate(client, phase_s))
    finally:
        client.close()
        cluster.job.close()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heartbeat", type=float, default=3.0, help="the death run's --heartbeat_timeout (s)")
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per rescale phase")
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    args = parser.parse_args(argv)
    results = {"machine": machine(), "death": death(args.heartbeat), "rescale": rescale(args.phase_s)}
    d, r = results["death"], results["rescale"]
    print(f"sync, 3 workers, heartbeat {d['heartbeat_timeout_s']:g}s: kill -9 -> next step in "
          f"{d['death_to_next_step_s']:.2f}s ({d['beyond_heartbeat_s']:+.2f}s beyond the heartbeat timeout)")
    print(f"async join: member after {r['join_to_member_s']:.2f}s, first applied gradient after "
          f"{r['join_to_first_applied_s']:.2f}s")
    print(f"examples/s: 2 workers {r['examples_per_s_2_workers']}, while joining {r['examples_per_s_while_joining']}, "
          f"4 workers {r['examples_per_s_4_workers']}, 2 again {r['examples_per_s_2_workers_after']} "
          f"(members after leaving: {', '.join(r['left_members'])})")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
