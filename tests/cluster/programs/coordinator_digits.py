"""The digits program of tests/cluster/programs/digits.py, in-graph: the chief coordinates and
schedules every step on every worker (synchronous in-graph training), the workers train.

Worker r (shard r of the executing workers) trains at global step t on `batch_for(r, t)`, as
replica r does in the between-graph program, so the sync oracle of test_sync_oracle.py applies.
The chief pulls the final values and saves them, with the global step, to OUT/chief.npz.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from pathlib import Path

import numpy as np

import shoal
from digits import OPTIMIZERS, batch_for, initial_variables, load_digits_data, loss_and_grad

steps = shoal.StepRegistry()


@steps.dataset
def digits_data(ctx):
    """Every worker loads the (small) training set itself; its batches come from `batch_for`."""
    return itertools.repeat(load_digits_data())


@steps.step
def train(ctx, data):
    x, y = next(data)
    idx = batch_for(ctx.shard_index, ctx.session.global_step, len(y))
    loss, result = ctx.session.run_step(loss_and_grad, x[idx], y[idx])
    return {"loss": float(loss), "step": result.global_step, "applied": result.applied}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--steps_per_dispatch", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    config = shoal.resolve_cluster_config(None, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret):
        return 0
    # the chief coordinates and never pushes: a step averages one gradient of every worker
    sync = shoal.SyncOptions(config.num_replicas - 1)
    with shoal.TrainingSession(config, initial_variables(), OPTIMIZERS[args.optimizer](), sync=sync, secret=secret,
                               min_shard_bytes=1024, request_timeout_s=30) as session:
        if not config.is_chief:
            shoal.serve_steps(config, steps, session, secret=secret, idle_timeout_s=120)
            return 0
        with shoal.Coordinator(config, steps, secret=secret, worker_timeout_s=60) as coordinator:
            data = coordinator.create_per_worker_dataset(digits_data)
            k = args.steps_per_dispatch
            rounds = [coordinator.schedule_on_every_worker(train, data, steps=min(k, args.steps - i))
                      for i in range(0, args.steps, k)]
            coordinator.join(timeout=120)
            last = [r.fetch(0) for r in rounds[-1]]
        session.pull()
        print(f"last round: {last}", flush=True)
        np.savez(args.out / "chief.npz", step=session.global_step,
                 applied=all(v["applied"] for v in last), **session.params)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
