"""A torch.optim optimizer as a ps update rule, and its param groups' learning rate and weight
decay at this step.

    torch.optim.SGD(momentum=0)          -> shoal SGD(lr, weight_decay)
    torch.optim.SGD(momentum>0)          -> shoal Momentum(lr, momentum, nesterov, weight_decay)
    torch.optim.Adam                     -> shoal AdamW(..., decoupled_weight_decay=False)
    torch.optim.AdamW                    -> shoal AdamW(..., decoupled_weight_decay=True)

The formulas are PyTorch's (shoal/ps/optimizers.py). Learning rate and weight decay are read
from every param group at every step and travel with the push, so LR schedulers and groups
with their own lr / weight_decay work. Every other setting (momentum, nesterov, betas, eps) is
fixed when training starts and must be the same in every group; anything the ps cannot run
(dampening, maximize, amsgrad, other optimizer classes) is refused with the reason. Pure
functions; thread-safe.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from shoal.ps.optimizers import SGD, AdamW, Momentum, UpdateRule
from shoal.ps.protocol import Hyper
from shoal.torch.errors import TorchTrainError

_FIXED = {  # per optimizer class: the group settings the ps rule holds, fixed for the whole job
    torch.optim.SGD: ("momentum", "dampening", "nesterov", "maximize"),
    torch.optim.Adam: ("betas", "eps", "amsgrad", "maximize", "decoupled_weight_decay"),
    torch.optim.AdamW: ("betas", "eps", "amsgrad", "maximize", "decoupled_weight_decay"),
}
SUPPORTED = "torch.optim.SGD (with or without momentum, nesterov), Adam and AdamW"


def fixed_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Per param group, the settings the ps rule fixes (everything but lr and weight_decay)."""
    keys = _FIXED.get(type(optimizer))
    if keys is None:
        raise TorchTrainError(f"shoal.torch cannot run {type(optimizer).__module__}.{type(optimizer).__qualname__} on "
                              f"the parameter servers; use {SUPPORTED}")
    return [{k: _plain(group.get(k)) for k in keys} for group in optimizer.param_groups]


def update_rule(optimizer: torch.optim.Optimizer) -> UpdateRule:
    """The ps update rule that runs `optimizer`'s formula (learning rate and weight decay of its
    first group; each push brings every group's own). Raises TorchTrainError naming the setting
    the ps cannot run."""
    groups = fixed_settings(optimizer)
    for i, settings in enumerate(groups[1:], start=1):
        for key, value in settings.items():
            if value != groups[0][key]:
                raise TorchTrainError(f"param group {i} has {key}={value!r} but group 0 has {groups[0][key]!r}; "
                                      "param groups may differ only in lr and weight_decay on Shoal")
    first, settings = optimizer.param_groups[0], groups[0]
    hyper = group_hyper(first, 0)
    if settings["maximize"]:
        raise TorchTrainError("maximize=True is not supported; minimize the negated objective instead")
    if type(optimizer) is torch.optim.SGD:
        if settings["dampening"]:
            raise TorchTrainError(f"SGD dampening={settings['dampening']!r} is not supported; use dampening=0")
        if not settings["momentum"]:
            return SGD(hyper.learning_rate, hyper.weight_decay)
        return Momentum(hyper.learning_rate, float(settings["momentum"]), bool(settings["nesterov"]),
                        hyper.weight_decay)
    if settings["amsgrad"]:
        raise TorchTrainError("amsgrad=True is not supported; use amsgrad=False")
    beta1, beta2 = settings["betas"]
    return AdamW(hyper.learning_rate, float(beta1), float(beta2), float(settings["eps"]), hyper.weight_decay,
                 decoupled_weight_decay=type(optimizer) is torch.optim.AdamW or bool(settings["decoupled_weight_decay"]))


def group_hyper(group: dict[str, Any], index: int) -> Hyper:
    """The learning rate and weight decay param group `index` holds now."""
    values = []
    for key in ("lr", "weight_decay"):
        value = float(group.get(key, 0.0))
        if not math.isfinite(value) or value < 0:
            raise TorchTrainError(f"param group {index} has {key}={value!r}; it must be a finite number >= 0")
        values.append(value)
    return Hyper(values[0], values[1])


def check_unchanged(at_start: Sequence[dict[str, Any]], groups: Sequence[dict[str, Any]]) -> None:
    """Raise TorchTrainError if a group was added or removed, or a fixed setting changed
    since training started (OneCycleLR's cycle_momentum changes momentum/betas)."""
    if len(groups) != len(at_start):
        raise TorchTrainError(f"the optimizer had {len(at_start)} param groups when DistributedOptimizer was created "
                              f"and has {len(groups)} now; create it after every group is added")
    for i, (group, before) in enumerate(zip(groups, at_start)):
        for key, value in before.items():
            now = _plain(group.get(key))
            if now != value:
                raise TorchTrainError(f"param group {i}'s {key} changed from {value!r} to {now!r}; only lr and "
                                      "weight_decay may change during training on Shoal (a scheduler that cycles "
                                      "momentum, such as OneCycleLR, needs cycle_momentum=False)")


def _plain(value: Any) -> Any:
    """Tensors as floats and tuples of them as tuples of floats, so settings compare by value."""
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value
