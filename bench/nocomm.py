"""The no-communication bound: one worker's training loop of the MNIST examples, with no ps
and no exchange of anything; run N copies at once to get the most examples/s N cores can do.

    python bench/nocomm.py --model softmax --steps 3000 --replica 0 --replicas 2

The loop is the examples' own, step for step: the same data (the MNIST cache), the same batch
(100) drawn from this replica's shard (by `shoal.ShardedBatches` and sorted for the softmax; by a
DataLoader over a TensorDataset for the MLP, as examples/mnist_mlp_torch.py does with
`shoal.torch.DistributedSampler`), the same model and loss (examples/mnist_softmax.py's softmax regression in NumPy; examples/mnist_mlp_torch.py's
784-256-10 MLP in PyTorch), one BLAS thread, and the same progress line every
`--log_every` steps (`shoal.ProgressReporter`'s format), so bench.mnist_throughput measures it like a worker. The
only difference is where the update happens: here SGD is applied in this process, in place,
where a Shoal worker pushes the gradient and receives new values. Whatever examples/s Shoal
reaches is a fraction of what these copies reach on the same cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread settings)

if __package__ in (None, ""):  # run as `python bench/nocomm.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal.datasets.mnist import default_cache_dir, load_mnist  # noqa: E402
from shoal.train.data import ShardedBatches  # noqa: E402

LEARNING_RATES = {"softmax": 0.5, "mlp": 0.1}  # the examples' defaults


def softmax_loop(data, batches, steps: int, lr: float, report) -> float:
    """examples/mnist_softmax.py's step, with the SGD update applied here. Returns the accuracy."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from mnist_softmax import accuracy, softmax_loss_and_grad  # the example's own model and loss

    params = {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    for step in range(1, steps + 1):
        idx = np.sort(next(batches))
        loss, grads = softmax_loss_and_grad(params, data.train_x[idx], data.train_y[idx])
        for name, grad in grads.items():
            params[name] -= lr * grad
        report(step, loss)
    return accuracy(params, data.test_x, data.test_y)


def mlp_loop(data, batches, steps: int, lr: float, report) -> float:
    """examples/mnist_mlp_torch.py's model, data loading and step on the CPU (a DataLoader over
    this replica's shard), with torch's SGD applied here."""
    import warnings

    import torch
    from torch import nn
    from torch.utils.data import BatchSampler, DataLoader, SubsetRandomSampler, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with warnings.catch_warnings():  # read-only memory maps, as in the example
        warnings.simplefilter("ignore", UserWarning)
        train = TensorDataset(torch.from_numpy(data.train_x), torch.from_numpy(data.train_y))
    shard = BatchSampler(SubsetRandomSampler(batches.shard.tolist()), batches.batch_size, drop_last=False)
    loader = DataLoader(train, batch_size=None, sampler=shard)  # one indexing per batch, as the example
    step = 0
    while step < steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            report(step, loss.item())
            if step >= steps:
                break
    with torch.no_grad():
        logits = model(torch.from_numpy(np.array(data.test_x)))  # a copy: the cache is a read-only mmap
    return float((logits.argmax(dim=1).numpy() == data.test_y).mean())


LOOPS = {"softmax": softmax_loop, "mlp": mlp_loop}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(LOOPS), required=True)
    parser.add_argument("--steps", type=int, required=True, help="local steps to run")
    parser.add_argument("--replica", type=int, default=0, help="which shard of the training set this copy reads")
    parser.add_argument("--replicas", type=int, default=1, help="how many copies run (the number of shards)")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=1, help="print the progress line every N local steps")
    args = parser.parse_args(argv)
    if args.log_every < 1:
        parser.error(f"--log_every must be 1 or more, got {args.log_every}")
    data = load_mnist(default_cache_dir(os.environ))
    batches = ShardedBatches(len(data.train_y), args.batch_size, args.replicas, args.replica)
    started = time.monotonic()

    def report(step: int, loss: float) -> None:  # ProgressReporter's line, every --log_every steps
        if step % args.log_every:
            return
        rate = step * args.batch_size / max(time.monotonic() - started, 1e-9)
        print(f"nocomm:{args.replica} step={step} loss={loss:.4f} examples/s={rate:.0f}", flush=True)

    acc = LOOPS[args.model](data, batches, args.steps, LEARNING_RATES[args.model], report)
    print(f"accuracy: {acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
