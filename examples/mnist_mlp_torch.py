"""Distributed MNIST with a PyTorch MLP (784-256-10) on Shoal's parameter servers.

examples/mnist_mlp_plain.py with 8 lines changed (docs/pytorch.md): `shoal.torch.init` resolves
the cluster from the flags or TF_CONFIG (a ps task serves there and exits; with no cluster, a ps
runs in this process, so `python examples/mnist_mlp_torch.py` trains alone), a `LeasedBatchSampler`
gives each worker the next free examples of the epoch from ps 0 (dynamic sharding: a worker that
dies gives its examples back, and a resumed job continues the epoch; docs/dynamic-sharding.md),
and a `DistributedOptimizer` pushes the gradients, with the examples they used, to the ps and
brings the new values into the model. The same cluster and training flags and TF_CONFIG as
examples/mnist_softmax.py (not its --sharding or --eval_every); `--steps` counts global steps.
Across machines the big first layer is partitioned over the ps tasks; on one machine the whole
0.8 MB model sits on ps 0 (one request per step: README, "Variables"). Workers use CUDA when
present; parameter servers never import torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings

# One BLAS thread per task: several tasks share the machine's cores, and idle BLAS threads that
# spin waiting for work slow every task down (torchrun sets OMP_NUM_THREADS=1 for the same reason).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings, which numpy reads at import)
import shoal.torch  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=1000, help="steps to train (default: 1000)")
    parser.add_argument("--log_every", type=int, default=100, help="print progress every N steps")
    parser.add_argument("--model_dir", default=os.environ.get("OUTPUT_DIR"), help="where to save the model")
    shoal.torch.add_flags(parser, os.environ)  # the cluster flags, --sync, the checkpoint flags, ...
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    job = shoal.torch.init(args, os.environ)  # a ps task serves here, then exits: it never imports torch

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from shoal.datasets.mnist import default_cache_dir, load_mnist

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"training on {device}", flush=True)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    loss_fn = nn.CrossEntropyLoss()
    data = load_mnist(default_cache_dir(os.environ))
    with warnings.catch_warnings():  # read-only memory maps, shared by the processes of a host: no copy
        warnings.simplefilter("ignore", UserWarning)
        train = TensorDataset(torch.from_numpy(data.train_x), torch.from_numpy(data.train_y))
    batches = shoal.torch.LeasedBatchSampler(train, job, args.batch_size)
    loader = DataLoader(train, batch_size=None, sampler=batches)  # one indexing per batch: ~3x less than per example
    opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    opt = shoal.torch.DistributedOptimizer(opt, model, job)
    step, local_steps, seen, started = 0, 0, 0, time.monotonic()  # local_steps: this process's
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            step = opt.global_step
            local_steps += 1
            seen += len(x)
            if local_steps % args.log_every == 0:
                rate = seen / (time.monotonic() - started)
                print(f"step={step} loss={loss.item():.4f} examples/s={rate:.0f}", flush=True)
            if step >= args.steps:
                break
    if local_steps % args.log_every:  # the step trained to, for `shoal status` (no rate: a partial interval)
        print(f"step={step} loss={loss.item():.4f} final", flush=True)
    opt.finish()  # the final values into the model; the chief saves the final checkpoint and export
    with torch.no_grad():
        logits = model(torch.from_numpy(np.ascontiguousarray(data.test_x)).to(device))
        acc = float((logits.argmax(dim=1).cpu().numpy() == data.test_y).mean())
    if args.model_dir and job.is_chief:
        torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))
    print(f"accuracy: {acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
