"""A coordinator program without a ps, for cluster tests of scheduling and failures.

The chief schedules `--closures` calls of `slow` (each prints "<task> start <n>", sleeps
`--sleep` seconds and returns its task and argument) and prints "ran <n> by <task>" for each
result, then "closures done: <count>". Workers serve steps with no TrainingSession.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import shoal

steps = shoal.StepRegistry()


@steps.step
def slow(ctx, n, seconds):
    print(f"{ctx.task} start {n}", flush=True)
    time.sleep(seconds)
    return {"task": ctx.task, "n": n}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--closures", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(None, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if not config.is_chief:
        shoal.serve_steps(config, steps, None, secret=secret, idle_timeout_s=120)
        return 0
    with shoal.Coordinator(config, steps, secret=secret, worker_timeout_s=60) as coordinator:
        results = [coordinator.schedule(slow, n, args.sleep) for n in range(args.closures)]
        coordinator.join(timeout=120)
        for r in results:
            value = r.fetch(0)
            print(f"ran {value['n']} by {value['task']}", flush=True)
    print(f"closures done: {len(results)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
