"""PyTorch adapter: an nn.Module's parameters as ps variables. Imports torch (workers only).

    variables = module_variables(model)              # initial values for TrainingSession
    assign_module(model, session.params)             # before forward()
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
