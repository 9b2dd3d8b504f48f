"""A BatchNorm MLP trained with shoal.torch: two param groups (weight decay on the weights only,
another lr for the rest), an LR schedule, a batch that depends only on the global step. Saves
the model's state_dict (safetensors) to --out. `train_oracle` is the same training with plain
torch.optim in one process, for the tests to compare against.

    python tests/cluster/programs/torch_bn.py --optimizer sgd --steps 8 --out state.safetensors [--sync ...]

`--device cuda` trains the model on the GPU (tests/gpu): the same values, within float rounding.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

import shoal.torch


def build() -> nn.Module:
    torch.manual_seed(0)
    # No bias before BatchNorm: its gradient would be rounding noise, which Adam scales up to full steps.
    return nn.Sequential(nn.Linear(6, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    weights = [p for name, p in model.named_parameters() if name in ("0.weight", "3.weight")]
    others = [p for name, p in model.named_parameters() if name not in ("0.weight", "3.weight")]
    if kind == "sgd":
        return torch.optim.SGD([{"params": weights, "weight_decay": 1e-2}, {"params": others, "lr": 0.05}],
                               lr=0.1, momentum=0.9, nesterov=True)
    return torch.optim.AdamW([{"params": weights, "weight_decay": 0.05}, {"params": others, "weight_decay": 0.0,
                                                                         "lr": 0.005}], lr=0.01)


def schedule(optimizer: torch.optim.Optimizer, start: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Halve every 3 steps (resumed at global step `start`)."""
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    for _ in range(start):
        scheduler.step()
    return scheduler


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(step)
    return torch.from_numpy(rng.normal(size=(32, 6)).astype(np.float32)), torch.from_numpy(rng.integers(0, 3, 32))


def train_oracle(kind: str, steps: int) -> dict[str, torch.Tensor]:
    """The same training in this process with plain torch.optim: the state_dict after `steps`."""
    model = build()
    optimizer = make_optimizer(kind, model)
    scheduler = schedule(optimizer, 0)
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
    return model.state_dict()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--out", required=True)
    parser.add_argument("--no_finish", action="store_true", help="end without opt.finish() (the at-exit path)")
    parser.add_argument("--device", default="cpu", help="where the model trains (cpu, cuda)")
    shoal.torch.add_flags(parser, os.environ)
    args = parser.parse_args(argv)
    job = shoal.torch.init(args, os.environ)
    model = build().to(args.device)
    opt = shoal.torch.DistributedOptimizer(make_optimizer(args.optimizer, model), model, job, request_timeout_s=30)
    scheduler = schedule(opt, opt.global_step)
    step = opt.global_step
    print(f"{job.task} starts at step {step}", flush=True)
    while step < args.steps:
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.to(args.device)), y.to(args.device)).backward()
        opt.step()
        scheduler.step()
        step = opt.global_step
    if not args.no_finish:
        opt.finish()
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, args.out)
    print(f"{job.task} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
