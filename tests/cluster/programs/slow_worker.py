"""A real training job with one slow worker, for the straggler figures: softmax regression on
sklearn's digits (digits.py), asynchronous, each worker a fixed number of local steps with a
ProgressReporter line every --log_every; worker --slow sleeps --slow_ms more per step."""

from __future__ import annotations

import argparse
import os
import sys
import time

import shoal
from digits import batch_for, initial_variables, load_digits_data, loss_and_grad


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_steps", type=int, default=20)
    parser.add_argument("--log_every", type=int, default=5)
    parser.add_argument("--slow", type=int, default=1, help="the replica index that is slow")
    parser.add_argument("--slow_ms", type=float, default=150)
    args = parser.parse_args()
    config = shoal.resolve_cluster_config(None, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if config.task.job == "ps":
        shoal.Server.for_task(config, secret=secret).join()
        return 0
    x, y = load_digits_data()
    with shoal.TrainingSession(config, initial_variables(), shoal.SGD(0.5), secret=secret,
                               request_timeout_s=30) as session:
        progress = shoal.ProgressReporter(session, args.log_every, len(batch_for(0, 0, len(y))))
        for _ in range(args.local_steps):
            idx = batch_for(config.replica_index, session.global_step, len(y))
            loss, result = session.run_step(loss_and_grad, x[idx], y[idx])
            if config.replica_index == args.slow:
                time.sleep(args.slow_ms / 1000)
            progress.step_done(loss, result.global_step, result.applied)
    return 0


if __name__ == "__main__":
    sys.exit(main())
