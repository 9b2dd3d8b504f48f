"""Distributed MNIST with a PyTorch MLP (784-256-10) on Shoal's parameter servers.

The same flags and TF_CONFIG as examples/mnist_softmax.py. The module's parameters become ps
variables (the big first layer is partitioned over the ps tasks); each step copies the current
values into the module, runs forward/backward, and pushes the gradients. Workers use CUDA when
present. Parameter servers never import torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

# One BLAS thread per task: several tasks share the machine's cores, and idle BLAS threads that
# spin waiting for work slow every task down (torchrun sets OMP_NUM_THREADS=1 for the same reason).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which numpy reads at import)

import shoal  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shoal.add_cluster_flags(parser)
    shoal.add_training_flags(parser, os.environ)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--batch_size", type=int, default=100)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    config = shoal.resolve_cluster_config(args, os.environ)
    secret = shoal.resolve_job_secret(os.environ)
    if shoal.serve_unless_training(config, secret=secret, security=shoal.wire_security(args)):
        return 0

    import torch
    from torch import nn

    from shoal.datasets.mnist import default_cache_dir, load_mnist
    from shoal.train.torch_model import assign_module, module_gradients, module_variables, share_module_memory

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    loss_fn = nn.CrossEntropyLoss()
    data = load_mnist(default_cache_dir(os.environ))
    batches = shoal.ShardedBatches(len(data.train_y), args.batch_size, config.num_replicas, config.replica_index)
    with shoal.TrainingSession(config, module_variables(model), shoal.SGD(args.learning_rate), secret=secret,
                               **shoal.session_options(args)) as session:
        shared = share_module_memory(model, session.params)  # on CPU the module reads session.params in place
        progress = shoal.ProgressReporter(session, args.log_every, args.batch_size)
        while not session.should_stop():
            idx = np.sort(next(batches))
            x = torch.from_numpy(np.ascontiguousarray(data.train_x[idx])).to(device)
            y = torch.from_numpy(np.ascontiguousarray(data.train_y[idx])).to(device)
            if not shared:
                assign_module(model, session.params)
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            result = session.push(module_gradients(model))
            progress.step_done(loss.item(), result.global_step)
        session.pull()
        assign_module(model, session.params)
        with torch.no_grad():
            logits = model(torch.from_numpy(np.ascontiguousarray(data.test_x)).to(device))
            acc = float((logits.argmax(dim=1).cpu().numpy() == data.test_y).mean())
        if session.summaries is not None:
            session.summaries.scalar("accuracy", acc, session.global_step)
    print(f"accuracy: {acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
