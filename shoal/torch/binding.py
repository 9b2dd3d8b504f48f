"""`ModelBinding`: a module's trained parameters as a session's variables, kept honest.

On the CPU the parameters become views of the session's arrays (which pushes and pulls update
in place), so the model always holds the ps values with no copy; on CUDA the values are copied
in after every step. Because a model that silently stopped following the ps trains nothing and
says nothing, `check()` refuses to step when a parameter was replaced, moved, or changed in
place behind the optimizer's back, and `gradients()` when no backward() ran since the last step.

`ModuleState` is the rest of the module's state_dict (buffers such as BatchNorm's running
statistics, parameters no optimizer trains): the session's LocalState, the chief's values going
into checkpoints and the export.

Not thread-safe; calls block only on CUDA copies.
"""

from __future__ import annotations

import weakref
from typing import Mapping

import numpy as np
import torch

from shoal.torch.errors import TorchTrainError


class ModelBinding:
    """The parameters `optimizer` trains, by their names in `model` (state_dict names).

    The constructor reads the model only. `attach(params)` (after the session started) makes
    the parameters follow `params`; `check()` and `gradients()` before each push, `pushed()`
    and `refresh(params)` after it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        names = {id(p): name for name, p in model.named_parameters()}
        trained: dict[int, int] = {}  # id(param) -> group
        for index, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if id(p) not in names:
                    raise TorchTrainError(f"param group {index} holds a parameter of shape {list(p.shape)} that is not "
                                          "in the model given to DistributedOptimizer; build the optimizer from "
                                          "model.parameters() of the same model")
                if p.requires_grad:
                    trained[id(p)] = index
        self.model = model
        self.parameters: dict[str, torch.nn.Parameter] = {
            name: p for name, p in model.named_parameters() if id(p) in trained}
        self.group_of: dict[str, int] = {name: trained[id(p)] for name, p in self.parameters.items()}
        if not self.parameters:
            raise TorchTrainError("the optimizer trains none of the model's parameters (none requires grad)")
        self.shared = False
        self._paths = {name: _path_to(model, name) for name in self.parameters}
        self._seen: dict[str, tuple[torch.device, int, int]] = {}  # name -> device, data_ptr, version
        self._pushed: dict[str, tuple[weakref.ref, int]] = {}  # name -> the gradient pushed last, its version

    def initial_values(self) -> dict[str, np.ndarray]:
        """name -> a CPU copy of each trained parameter: what the chief initializes the job with."""
        return {name: p.detach().cpu().numpy().copy() for name, p in self.parameters.items()}

    @torch.no_grad()
    def attach(self, params: Mapping[str, np.ndarray], share: bool | None = None) -> None:
        """Make the parameters hold `params` (a started session's): views of them when every
        parameter is on the CPU (or `share` says so), else a copy, which `refresh` repeats
        after every step."""
        on_cpu = all(p.device.type == "cpu" for p in self.parameters.values())
        if share and not on_cpu:
            raise TorchTrainError("only parameters on the CPU can share memory with Shoal's copy")
        self.shared = on_cpu if share is None else share
        for name, p in self.parameters.items():
            if self.shared:
                p.data = torch.from_numpy(params[name])
            else:
                p.copy_(torch.from_numpy(params[name]))
        self._remember()

    @torch.no_grad()
    def refresh(self, params: Mapping[str, np.ndarray]) -> None:
        """After a push or pull updated `params`: copy them in unless the parameters share them."""
        if not self.shared:
            for name, p in self.parameters.items():
                p.copy_(torch.from_numpy(params[name]))
        self._remember()

    def check(self) -> None:
        """Raise TorchTrainError unless every parameter is still the one registered, on the
        same memory, unchanged since Shoal last wrote it."""
        for name, p in self.parameters.items():
            if not _still_at(self._paths[name], p) and self._current(name) is not p:
                raise TorchTrainError(
                    f"model parameter {name!r} is not the one DistributedOptimizer was given: the module or the "
                    "parameter was replaced after it was created, so the model would no longer train; build the "
                    "model completely (and move it to its device) before creating the DistributedOptimizer")
            device, address, version = self._seen[name]
            if p.device != device or p.data_ptr() != address:
                raise TorchTrainError(
                    f"model parameter {name!r} no longer holds Shoal's values: its data was replaced (model.to(...), "
                    "`p.data = ...`, load_state_dict(assign=True)) after DistributedOptimizer was created, so the "
                    "model would no longer see the trained values; move the model and load its weights before "
                    "creating the DistributedOptimizer")
            if p._version != version:
                raise TorchTrainError(
                    f"model parameter {name!r} was changed in place after DistributedOptimizer was created "
                    "(load_state_dict, p.copy_(), an in-place op): the ps holds the trained values and would "
                    "overwrite the change; load weights before creating the DistributedOptimizer (the chief's "
                    "values initialize the job) or resume from the job's model_dir")

    def _current(self, name: str) -> torch.nn.Parameter | None:
        """The model's parameter `name` now, looked up as torch does (None if there is none)."""
        try:
            return self.model.get_parameter(name)
        except AttributeError:
            return None

    def gradients(self) -> dict[str, np.ndarray]:
        """name -> CPU numpy gradient (zeros for a parameter backward() did not reach). Raises
        TorchTrainError if no parameter has a gradient, or if every gradient is the one the last
        step pushed (step() again without backward())."""
        grads: dict[str, np.ndarray] = {}
        found = fresh = False
        for name, p in self.parameters.items():
            g = p.grad
            if g is None:
                grads[name] = np.zeros(tuple(p.shape), dtype=_numpy_dtype(p))
                continue
            found = True
            pushed = self._pushed.get(name)
            fresh = fresh or pushed is None or pushed[0]() is not g or pushed[1] != g._version
            # (on the CPU a gradient that needs no grad is read as it is: no alias, no .cpu() call)
            grads[name] = g.numpy() if self.shared and not g.requires_grad else g.detach().cpu().numpy()
        if not found:
            raise TorchTrainError("step() found no gradients: call loss.backward() before opt.step() "
                                  "(after opt.zero_grad())")
        if not fresh:
            raise TorchTrainError("step() was called again without a new loss.backward(): every gradient is the "
                                  "one the last step already pushed; call opt.zero_grad(), compute the loss, "
                                  "loss.backward(), then opt.step()")
        return grads

    def pushed(self) -> None:
        """Remember the gradients just pushed, to tell them from new ones at the next step."""
        self._pushed = {name: (weakref.ref(p.grad), p.grad._version)
                        for name, p in self.parameters.items() if p.grad is not None}

    def _remember(self) -> None:
        self._seen = {name: (p.device, p.data_ptr(), p._version) for name, p in self.parameters.items()}


class ModuleState:
    """The module's state_dict entries that are not trained on the ps (buffers, frozen
    parameters): `values()` reads them (the chief's go into checkpoints and the export),
    `restore()` writes them back. Blocks on CUDA copies; not thread-safe."""

    def __init__(self, model: torch.nn.Module, trained: Mapping[str, torch.nn.Parameter]):
        self._model = model
        self.names = tuple(name for name in model.state_dict(keep_vars=True) if name not in trained)

    def values(self) -> dict[str, np.ndarray]:
        state = self._model.state_dict()
        return {name: state[name].detach().cpu().numpy().copy() for name in self.names}

    @torch.no_grad()
    def restore(self, values: Mapping[str, np.ndarray]) -> None:
        state = self._model.state_dict(keep_vars=True)
        for name in self.names:
            state[name].copy_(torch.from_numpy(np.array(values[name])))  # a writable copy


_Links = tuple[tuple[torch.nn.Module, str, torch.nn.Module], ...]
"""The modules from the model to a parameter's owner: (parent, attribute, child) per level."""


def _path_to(model: torch.nn.Module, name: str) -> tuple[_Links, torch.nn.Module, str]:
    """Where parameter `name` (a state_dict name) sits: the module path, the owning module and
    its attribute, as they are now."""
    *atoms, attribute = name.split(".")
    links, module = [], model
    for atom in atoms:
        child = module.get_submodule(atom)
        links.append((module, atom, child))
        module = child
    return tuple(links), module, attribute


def _still_at(path: tuple[_Links, torch.nn.Module, str], p: torch.nn.Parameter) -> bool:
    """Whether every module of `path` still holds the next one, and the owner still holds `p`:
    the identity `get_parameter` would find, by the dicts nn.Module keeps them in, without its
    per-call name splitting and checks (`check` runs every step). False means "look it up"."""
    links, owner, attribute = path
    for parent, atom, child in links:
        if parent._modules.get(atom) is not child:
            return False
    return owner._parameters.get(attribute) is p


def _numpy_dtype(p: torch.Tensor) -> np.dtype:
    return np.dtype(str(p.dtype).removeprefix("torch."))
