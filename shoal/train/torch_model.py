"""PyTorch adapter: an nn.Module's parameters as ps variables. Imports torch (workers only).

    variables = module_variables(model)              # initial values for TrainingSession
    shared = share_module_memory(model, session.params)   # CPU: the module reads session.params
    if not shared: assign_module(model, session.params)   # CUDA: copy before each forward()
    loss.backward(); session.push(module_gradients(model))

The module may live on CUDA: values are copied to its device, gradients back to the CPU.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch


def module_variables(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """name -> CPU numpy copy of every trainable parameter (state_dict names)."""
    return {name: p.detach().cpu().numpy().copy() for name, p in module.named_parameters() if p.requires_grad}


@torch.no_grad()
def share_module_memory(module: torch.nn.Module, params: Mapping[str, np.ndarray]) -> bool:
    """Make a CPU module's parameters views of `params` (a session's `params`, which pulls and
    pushes update in place), so the module always holds the current values with no copy per
    step. Returns False, changing nothing, if any parameter is not on the CPU."""
    if any(p.device.type != "cpu" for p in module.parameters()):
        return False
    for name, p in module.named_parameters():
        if name in params:
            p.data = torch.from_numpy(params[name])
    return True


@torch.no_grad()
def assign_module(module: torch.nn.Module, params: Mapping[str, np.ndarray]) -> None:
    """Copy `params` into the module's parameters, on whatever device they live."""
    for name, p in module.named_parameters():
        if name in params:
            p.copy_(torch.from_numpy(params[name]), non_blocking=False)


def module_gradients(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """name -> CPU numpy gradient after backward() (zeros for a parameter that got none)."""
    grads = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        grads[name] = (p.grad.detach().cpu().numpy() if p.grad is not None
                       else np.zeros(tuple(p.shape), dtype=np.dtype(str(p.dtype).removeprefix("torch."))))
    return grads
