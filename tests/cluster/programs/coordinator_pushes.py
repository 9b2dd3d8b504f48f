"""A coordinator program whose closures push to the ps, for the exactly-once test.

Variables `a` (4 floats) and `b` (3 floats) start at 0 and train with SGD(1.0); every push is a
gradient of -1 everywhere, so each applied push adds exactly 1 to every element and the final
values count the pushes the ps applied. The chief schedules `--closures` calls of `count`,
which pushes `--pushes` times, prints "<task> pushed <n>", then sleeps `--sleep` seconds (the
window in which a test kills the worker). The chief then prints "a=<min>..<max> b=<min>..<max>" and
"closures done: <count>".
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import numpy as np

import shoal

steps = shoal.StepRegistry()


@steps.step
def count(ctx, n, pushes, seconds):
    for _ in range(pushes):
        ctx.session.push({"a": -np.ones(4), "b": -np.ones(3)})
    print(f"{ctx.task} pushed {n}", flush=True)
    time.sleep(seconds)
    return {"task": ctx.task, "n": n}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--closures", type=int, default=20)
    parser.add_argument("--pushes", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(None, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret):
        return 0
    variables = {"a": np.zeros(4), "b": np.zeros(3)}
    with shoal.TrainingSession(config, variables, shoal.SGD(1.0), secret=secret, min_shard_bytes=1,
                               request_timeout_s=30, heartbeat_timeout_s=3) as session:
        if not config.is_chief:
            shoal.serve_steps(config, steps, session, secret=secret, idle_timeout_s=120)
            return 0
        with shoal.Coordinator(config, steps, secret=secret, worker_timeout_s=60) as coordinator:
            results = [coordinator.schedule(count, n, args.pushes, args.sleep) for n in range(args.closures)]
            coordinator.join(timeout=120)
            for r in results:
                value = r.fetch(0)
                print(f"ran {value['n']} by {value['task']}", flush=True)
        session.pull()
        a, b = session.params["a"], session.params["b"]
        print(f"a={a.min():.0f}..{a.max():.0f} b={b.min():.0f}..{b.max():.0f}", flush=True)
    print(f"closures done: {len(results)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
