"""Distributed MNIST softmax regression: the seed program of distributed TensorFlow, on Shoal.

Run the same program on every task; its role comes from the classic flags or TF_CONFIG:

    python examples/mnist_softmax.py --ps_hosts=localhost:2222,localhost:2223 \
        --worker_hosts=localhost:2224,localhost:2225 --job_name=worker --task_index=1

Softmax regression 784 -> 10, batch 100, SGD with learning rate 0.5. `--sync` aggregates the
gradients of every worker per step. Each worker ends with `accuracy: <test accuracy>`;
parameter servers exit 0 by themselves when the workers are done.

With `--model_dir DIR` (default: $OUTPUT_DIR) the chief saves checkpoints there every
`--checkpoint_every_steps` steps and at the end, a run started again carries on from the newest
one (`restored checkpoint step=N`), a ps task that dies and is started again gets its variables
back, and every task writes TensorBoard summaries (`tensorboard --logdir DIR`). The final model
is DIR/export/model.safetensors.
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
from shoal.datasets.mnist import load_mnist


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
    parser.add_argument("--sync", action="store_true", help="synchronous training (default: asynchronous)")
    parser.add_argument("--replicas_to_aggregate", type=int, default=None,
                        help="with --sync: gradients per step (default: all workers; fewer = backup workers)")
    parser.add_argument("--steps", type=int, default=1000, help="global steps to train (default: 1000)")
    parser.add_argument("--model_dir", default=os.environ.get("OUTPUT_DIR"),
                        help="model directory shared by the job (default: $OUTPUT_DIR)")
    parser.add_argument("--learning_rate", type=float, default=None, help="default: 0.5 (softmax), 0.1 (MLP)")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=100, help="print progress every N local steps")
    parser.add_argument("--eval_every", type=int, default=0,
                        help="chief: test accuracy every N local steps, printed as 'eval_step=S accuracy=A eval_s=T' "
                             "(default 0: only at the end)")
    parser.add_argument("--checkpoint_every_steps", type=int, default=100,
                        help="with --model_dir: save a checkpoint every N global steps (0: only at the end)")
    parser.add_argument("--checkpoint_every_secs", type=float, default=600)
    parser.add_argument("--keep_checkpoints", type=int, default=5)
    parser.add_argument("--ps_recovery_timeout", type=float, default=120,
                        help="seconds to wait for a lost ps task to come back before failing")
    return parser.parse_args(argv)


def report_progress(args, session, local_steps: int, started: float, loss: float, global_step: int) -> None:
    """Every --log_every local steps: print `<task> step=N loss=X examples/s=R`, and log the loss."""
    if local_steps % args.log_every:
        return
    rate = local_steps * args.batch_size / (time.monotonic() - started)
    print(f"{session.task} step={global_step} loss={loss:.4f} examples/s={rate:.0f}", flush=True)
    if session.summaries is not None:
        session.summaries.scalar("loss", loss, global_step)


def session_options(args) -> dict:
    """TrainingSession keyword arguments from the flags both examples share."""
    return dict(max_steps=args.steps, model_dir=args.model_dir or None, summary_every_steps=args.log_every,
                checkpoints=shoal.CheckpointOptions(every_steps=args.checkpoint_every_steps or None,
                                                    every_s=args.checkpoint_every_secs or None,
                                                    keep=args.keep_checkpoints),
                ps_recovery_timeout_s=args.ps_recovery_timeout)


def is_training_task(config: shoal.ClusterConfig) -> bool:
    """Run the task's role if it does not train: a ps serves until the job is over (blocks)."""
    if config.task.job == "ps":
        server = shoal.Server.for_task(config)
        server.join()
        print(f"{config.task} done: {server.reason}")
        return False
    if config.task.job == "evaluator":
        print("this example has no evaluator; nothing to do")
        return False
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(args, os.environ)
    if not is_training_task(config):
        return 0

    data = load_mnist()
    variables = {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    sync = shoal.SyncOptions(args.replicas_to_aggregate) if args.sync else False
    batches = shoal.ShardedBatches(len(data.train_y), args.batch_size, config.num_replicas, config.replica_index)
    with shoal.TrainingSession(config, variables, shoal.SGD(args.learning_rate or 0.5), sync=sync,
                               **session_options(args)) as session:
        local_steps, started = 0, time.monotonic()
        while not session.should_stop():
            idx = np.sort(next(batches))
            loss, result = session.run_step(softmax_loss_and_grad, data.train_x[idx], data.train_y[idx])
            local_steps += 1
            report_progress(args, session, local_steps, started, loss, result.global_step)
            if config.is_chief and args.eval_every and local_steps % args.eval_every == 0:
                eval_started = time.monotonic()
                acc = accuracy(session.params, data.test_x, data.test_y)
                print(f"eval_step={result.global_step} accuracy={acc:.4f} eval_s={time.monotonic() - eval_started:.3f}",
                      flush=True)
                if session.summaries is not None:
                    session.summaries.scalar("accuracy", acc, result.global_step)
        session.pull()
        acc = accuracy(session.params, data.test_x, data.test_y)
        if session.summaries is not None:
            session.summaries.scalar("accuracy", acc, session.global_step)
    print(f"accuracy: {acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
