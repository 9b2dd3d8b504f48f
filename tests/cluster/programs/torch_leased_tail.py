"""Cluster-test program: sync shoal.torch training for one epoch of a small synthetic data set
through a `LeasedBatchSampler`, with the model holding a copy of the session's values (as a
model on a GPU does). At the start of every step it checks that the model holds the session's
current values and prints `stale model at step S` if not: after a sync step this worker took
part in with no data (the tail of the epoch), the values must have been brought into the model.

    python tests/cluster/programs/torch_leased_tail.py --sync [--step_sleep S] [--lease_size N]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import shoal.torch

N, BATCH, LEASE = 640, 16, 48


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step_sleep", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--lease_size", type=int, default=LEASE, help="positions per lease request")
    shoal.torch.add_flags(parser, os.environ)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    job = shoal.torch.init(args, os.environ)
    torch.manual_seed(0)
    x = torch.randn(N, 8)
    y = (x[:, 0] > 0).long()
    data = TensorDataset(x, y)
    model = nn.Linear(8, 2)
    opt = shoal.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job,
                                           request_timeout_s=30)
    with torch.no_grad():  # memory of its own (the optimizer made the parameters views of the session's values)
        for p in model.parameters():
            p.data = p.data.clone()
    opt.binding.attach(opt.session.params, share=False)  # copies, as for a model on a GPU
    loader = DataLoader(data, batch_size=None, sampler=shoal.torch.LeasedBatchSampler(data, job, BATCH, lease_size=args.lease_size,
                                                                                       epochs=1))
    steps = 0
    for xb, yb in loader:
        for name, p in opt.binding.parameters.items():
            if not torch.equal(p.detach(), torch.from_numpy(opt.session.params[name])):
                print(f"stale model at step {opt.global_step}: {name}", flush=True)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        steps += 1
        print(f"{job.task} stepped {steps}", flush=True)
        time.sleep(args.step_sleep)
    opt.finish()
    print(f"{job.task} done after {steps} steps at global step {opt.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
