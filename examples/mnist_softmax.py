"""Distributed MNIST softmax regression: the seed program of distributed TensorFlow, on Shoal.

Run the same program on every task; its role comes from the classic flags or TF_CONFIG:

    python examples/mnist_softmax.py --ps_hosts=localhost:2222,localhost:2223 \
        --worker_hosts=localhost:2224,localhost:2225 --job_name=worker --task_index=1

Softmax regression 784 -> 10, batch 100, SGD with learning rate 0.5. `--sync` aggregates the
gradients of every worker per step. Workers lease their batches from ps 0 (dynamic sharding,
docs/dynamic-sharding.md): each takes the next free examples of the epoch, a worker that dies
gives its examples back, and the epoch and position are saved with the checkpoints, so a resumed
job continues the epoch. `--sharding static` reads a fixed shard per worker instead. Each worker ends with `accuracy: <test accuracy>`;
parameter servers exit 0 by themselves when the workers are done.

With `--model_dir DIR` (default: $OUTPUT_DIR) the chief saves checkpoints there every
`--checkpoint_every_secs` seconds (60; or every `--checkpoint_every_steps` steps), at the end,
and when the job is stopped (SIGTERM: `shoal kill`, a deadline, preemption; at the next step,
then the task exits 143). A periodic save is a DEBUG line only; the chief's progress line counts
them (`checkpoints=N`). A run started again carries on from the newest one (`restored checkpoint
step=N`), a ps task that dies and is started again gets its variables back, and every worker
writes TensorBoard summaries, the chief into DIR and the others into DIR/worker_N
(`tensorboard --logdir DIR`). The final model is DIR/export/model.safetensors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

# One BLAS thread per task: several tasks share the machine's cores, and idle BLAS threads that
# spin waiting for work slow every task down (torchrun sets OMP_NUM_THREADS=1 for the same reason).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which numpy reads at import)

import shoal  # noqa: E402
from shoal.datasets.mnist import default_cache_dir, load_mnist


def softmax_loss_and_grad(params, x, y):
    """Mean cross-entropy of softmax(x W + b) and its gradients."""
    logits = x @ params["W"] + params["b"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(probs[rows, y] + 1e-12).mean())
    probs[rows, y] -= 1.0
    probs /= len(y)
    return loss, {"W": x.T @ probs, "b": probs.sum(axis=0)}


def accuracy(params, x, y) -> float:
    return float(((x @ params["W"] + params["b"]).argmax(axis=1) == y).mean())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shoal.add_cluster_flags(parser)
    shoal.add_training_flags(parser, os.environ)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--sharding", choices=["leased", "static"], default="leased",
                        help="leased (default): batches leased from ps 0, shared dynamically; static: a fixed shard "
                             "per worker")
    parser.add_argument("--eval_every", type=int, default=0,
                        help="chief: test accuracy every N local steps, printed as 'eval_step=S accuracy=A eval_s=T' "
                             "(default 0: only at the end)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(args, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret, security=shoal.wire_security(args),
                                   replication=shoal.replication_options(args)):
        return 0

    data = load_mnist(default_cache_dir(os.environ))
    variables = {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    with shoal.TrainingSession(config, variables, shoal.SGD(args.learning_rate), secret=secret,
                               **shoal.session_options(args)) as session:
        if args.sharding == "leased":
            batches = session.leased_batches(len(data.train_y), args.batch_size)
        else:
            batches = shoal.ShardedBatches(len(data.train_y), args.batch_size, config.num_replicas,
                                           config.replica_index)
        progress = shoal.ProgressReporter(session, args.log_every, args.batch_size)
        while not session.should_stop():
            batch = next(batches)
            leased = isinstance(batch, shoal.LeasedBatch)
            idx = np.sort(batch.indices if leased else batch)
            loss, result = session.run_step(softmax_loss_and_grad, data.train_x[idx], data.train_y[idx],
                                            used=batch if leased else None)
            progress.step_done(loss, result.global_step, result.applied)
            if args.eval_every and config.is_chief and progress.local_steps % args.eval_every == 0:
                eval_started = time.monotonic()
                acc = accuracy(session.params, data.test_x, data.test_y)
                print(f"eval_step={result.global_step} accuracy={acc:.4f} eval_s={time.monotonic() - eval_started:.3f}",
                      flush=True)
                if session.summaries is not None:
                    session.summaries.scalar("accuracy", acc, result.global_step)
        session.pull()
        progress.finish(session.global_step)
        acc = accuracy(session.params, data.test_x, data.test_y)
        if session.summaries is not None:
            session.summaries.scalar("accuracy", acc, session.global_step)
    print(f"accuracy: {acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (shoal.ClusterError, shoal.SecretError, shoal.ModelDirLockedError) as e:  # the fix, no traceback
        sys.exit(f"{os.path.basename(__file__)}: {e}")
