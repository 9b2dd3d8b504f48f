"""Peer: PyTorch `DistributedDataParallel` with the gloo backend on MNIST: every worker holds
the model, each step all-reduces (mean) the gradients of the workers' batches of 100, and
applies them with `torch.optim.SGD`. Fed each step from the worker's numpy shard (the same
shards as Shoal's); one torch thread per process, as Shoal's torch example uses.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... \
        python bench/peers/torch_ddp.py --model softmax --steps 1500 --data DIR

Rank 0 evaluates; both ranks run exactly --steps steps.
"""

from __future__ import annotations

import time

import peerlib  # first: thread settings

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402


def build(model: str) -> nn.Module:
    """The model with peerlib.init_params' values (softmax zeros; the MLP's U(+-1/sqrt(fan_in)))."""
    values = peerlib.init_params(model)
    if model == "softmax":
        module = nn.Linear(784, 10)
        layers = [(module, "W", "b")]
    else:
        module = nn.Sequential(nn.Linear(784, peerlib.HIDDEN), nn.ReLU(), nn.Linear(peerlib.HIDDEN, 10))
        layers = [(module[0], "W1", "b1"), (module[2], "W2", "b2")]
    with torch.no_grad():
        for layer, w, b in layers:
            layer.weight.copy_(torch.from_numpy(values[w].T.copy()))
            layer.bias.copy_(torch.from_numpy(values[b]))
    return module


def main() -> int:
    args = peerlib.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = peerlib.Mnist(args.data)
    shard = peerlib.Shard(data, world, rank)
    model = nn.parallel.DistributedDataParallel(build(args.model))
    optimizer = torch.optim.SGD(model.parameters(), lr=peerlib.LEARNING_RATE[args.model])
    loss_fn = nn.CrossEntropyLoss()
    test_x, test_y = torch.from_numpy(data.test_x), data.test_y

    def test_accuracy() -> float:
        with torch.no_grad():
            return float((model.module(test_x).argmax(dim=1).numpy() == test_y).mean())

    reporter = peerlib.Reporter(args.eval_every, peerlib.BATCH * world)
    for global_step in range(1, args.steps + 1):
        bx, by = shard.next()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(torch.from_numpy(bx)), torch.from_numpy(by)).backward()
        optimizer.step()
        reporter.step(global_step)
        if rank == 0 and reporter.due(global_step):
            started = time.monotonic()
            acc = test_accuracy()
            reporter.evaluated(global_step, acc, time.monotonic() - started)
    if rank == 0:
        peerlib.final(test_accuracy())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
