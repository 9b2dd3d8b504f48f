"""Cluster-test program of dynamic data sharding: softmax regression on sklearn's digits with
batches leased from ps 0 (`session.leased_batches`). Every task runs it; the role comes from
TF_CONFIG. Each worker appends the positions of every push the ps applied to
OUT/<job><index>-<pid>.used (one line per push, flushed), and prints `pushed N` after each."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import shoal
from digits import initial_variables, load_digits_data, loss_and_grad

BATCH = 16


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="global steps (default: no limit)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs of the data set (default: no limit)")
    parser.add_argument("--lease_size", type=int, default=48)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--round_robin", action="store_true", help="spread the variables over the ps tasks")
    parser.add_argument("--model_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    config = shoal.resolve_cluster_config(None, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret):
        return 0
    x, y = load_digits_data()
    log_file = args.out / f"{config.task.job}{config.task.index}-{os.getpid()}.used"
    pushed = 0
    with shoal.TrainingSession(config, initial_variables(), shoal.SGD(0.5), secret=secret, sync=args.sync,
                               max_steps=args.steps, request_timeout_s=30, model_dir=args.model_dir,
                               checkpoints=shoal.CheckpointOptions(every_s=None),
                               placement=shoal.PlacementStrategy.ROUND_ROBIN if args.round_robin else
                               shoal.PlacementStrategy.GREEDY) as session, \
            open(log_file, "a") as used_log:
        for batch in session.leased_batches(len(y), BATCH, seed=1, lease_size=args.lease_size, epochs=args.epochs):
            if session.should_stop():
                break
            _, result = session.run_step(loss_and_grad, x[batch.indices], y[batch.indices], used=batch)
            if result.applied:
                positions = [p for _, start, end in batch.used.ranges for p in range(start, end)]
                used_log.write(" ".join(map(str, positions)) + "\n")
                used_log.flush()
            pushed += 1
            print(f"pushed {pushed}", flush=True)
            time.sleep(args.step_sleep)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
