"""Distributed MNIST softmax regression, in-graph: the chief coordinates, the workers run steps.

The same model as examples/mnist_softmax.py, with the same flags and TF_CONFIG, but one client
(the chief) schedules the training steps and the workers execute them on their own
TrainingSessions, each on its own shard of the data (in-graph replication; docs/coordinator.md):

    shoal train examples/mnist_coordinator.yaml

or by hand, with a chief, ps and workers in TF_CONFIG (or the classic flags, where worker 0
coordinates and the other workers execute). `--steps` counts the steps of all workers
together, `--steps_per_dispatch` how many a worker runs per scheduled call. With `--sync`,
every worker runs every step and the ps applies their average once per global step. With
`--model_dir`, the chief saves checkpoints every `--checkpoint_every_steps` global steps (or
`--checkpoint_every_secs`) and at the end, and a run started again on the same directory resumes
from the newest one and schedules only the steps left. The chief ends with `accuracy: <test
accuracy>`; workers and ps tasks exit 0 when the chief is done.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import shoal  # noqa: E402
from shoal.datasets.mnist import default_cache_dir, load_mnist  # noqa: E402

steps = shoal.StepRegistry()


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


@steps.dataset
def mnist_batches(ctx, batch_size):
    """Runs on each worker: endless batches of its own shard (the data never leaves it)."""
    data = load_mnist(default_cache_dir(os.environ))
    batches = shoal.ShardedBatches(len(data.train_y), batch_size, ctx.num_shards, ctx.shard_index)
    for idx in batches:
        idx = np.sort(idx)
        yield data.train_x[idx], data.train_y[idx]


@steps.step
def train(ctx, batches):
    """Runs on a worker: one step of SGD through its session (pull, gradient, push)."""
    x, y = next(batches)
    loss, result = ctx.session.run_step(softmax_loss_and_grad, x, y)
    return {"loss": loss, "global_step": result.global_step}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shoal.add_cluster_flags(parser)
    shoal.add_training_flags(parser, os.environ)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--steps_per_dispatch", type=int, default=10,
                        help="steps a worker runs per scheduled call (default 10; more = less scheduling overhead)")
    parser.add_argument("--eval_every", type=int, default=0, help="accepted for compatibility; evaluates at the end")
    args = parser.parse_args(argv)
    if args.steps_per_dispatch < 1:
        parser.error(f"--steps_per_dispatch must be >= 1, got {args.steps_per_dispatch}")
    return args


def coordinate(args, config, secret, session) -> None:
    """The chief: schedule every step on the workers, report progress, wait for them all."""
    started = time.monotonic()
    first = session.global_step  # > 0 when the chief's session resumed from a checkpoint in --model_dir
    if first:
        print(f"{session.task} resumed at step {first}; scheduling the {args.steps - first} steps left", flush=True)
    # session=: the chief never pushes, so the coordinator watches the ps for it and rebuilds one that dies
    with shoal.Coordinator(config, steps, secret=secret, security=shoal.wire_security(args),
                           session=session) as coordinator:
        batches = coordinator.create_per_worker_dataset(mnist_batches, args.batch_size)
        k = args.steps_per_dispatch
        window = 4 * coordinator.num_workers  # closures scheduled ahead: enough to keep every worker busy

        def schedule(i: int):
            if args.sync:  # every worker runs every step; the ps averages their gradients once per step
                return coordinator.schedule_on_every_worker(train, batches, steps=min(k, args.steps - i))[0]
            return coordinator.schedule(train, batches, steps=min(k, args.steps - i))

        results = collections.deque()
        ahead = first  # the first step not scheduled yet
        done = top = first
        while results or ahead < args.steps:
            while ahead < args.steps and len(results) < window:
                results.append(schedule(ahead))
                ahead += k
            value = results.popleft().fetch(timeout=600)
            top = max(top, value["global_step"])  # closures end out of order: the highest step seen is the job's
            before, done = done, min(args.steps, done + k)
            session.checkpoint_if_due()  # the chief never pushes: its periodic checkpoints are taken here
            if done // args.log_every > before // args.log_every or done == args.steps:
                rate = (done - first) * args.batch_size / max(1e-9, time.monotonic() - started)
                print(f"{session.task} step={top} loss={value['loss']:.4f} examples/s={rate:.0f}",
                      flush=True)
        coordinator.join(timeout=600)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(args, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret, security=shoal.wire_security(args),
                                   replication=shoal.replication_options(args)):
        return 0

    variables = {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    options = shoal.session_options(args)
    if args.sync:  # the chief coordinates and never pushes: a step averages one gradient per worker
        options["sync"] = shoal.SyncOptions(args.replicas_to_aggregate or config.num_replicas - 1)
    with shoal.TrainingSession(config, variables, shoal.SGD(args.learning_rate), secret=secret, **options) as session:
        if not config.is_chief:
            shoal.serve_steps(config, steps, session, secret=secret, security=shoal.wire_security(args))
            return 0
        coordinate(args, config, secret, session)
        session.pull()
        data = load_mnist(default_cache_dir(os.environ))
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
