"""A synthetic big model for benchmarks: one float32 variable of `--mib` MiB (default 64) trained
with Shoal's TrainingSession, the same flags and TF_CONFIG as examples/mnist_softmax.py
(cluster, training, checkpoint and replication flags).

Each step pushes one fixed gradient of the variable's size (no compute: the step is the
exchange, and a ps's work is the update of its shards) and counts `--batch_size` nominal
examples, so its progress lines read like the examples'. The variable is cut into shards of
`--push_part_bytes` over the ps tasks as any large variable is. Ends with `done step=N`.

    python bench/big_model.py --ps_hosts ... --worker_hosts ... --job_name worker --task_index 0
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

if __package__ in (None, ""):  # run as `python bench/big_model.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import shoal  # noqa: E402

ROW_FLOATS = 1024  # 4 KiB rows: the placement cuts the variable by rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shoal.add_cluster_flags(parser)
    shoal.add_training_flags(parser, os.environ)
    parser.add_argument("--mib", type=int, default=64, help="size of the variable in MiB (default 64)")
    parser.add_argument("--batch_size", type=int, default=100, help="nominal examples per step (default 100)")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    args = parser.parse_args(argv)
    if args.mib < 1:
        parser.error(f"--mib must be at least 1, got {args.mib}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(args, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret, security=shoal.wire_security(args),
                                   replication=shoal.replication_options(args)):
        return 0
    rows = args.mib * (1 << 20) // (4 * ROW_FLOATS)
    variables = {"W": np.zeros((rows, ROW_FLOATS), np.float32)}
    grad = {"W": np.random.default_rng(config.replica_index).standard_normal((rows, ROW_FLOATS), np.float32)}
    with shoal.TrainingSession(config, variables, shoal.SGD(args.learning_rate), secret=secret,
                               **shoal.session_options(args)) as session:
        progress = shoal.ProgressReporter(session, args.log_every, args.batch_size)
        while not session.should_stop():
            result = session.push(grad)
            progress.step_done(float(session.params["W"][0, 0]), result.global_step, result.applied)
    print(f"done step={session.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
