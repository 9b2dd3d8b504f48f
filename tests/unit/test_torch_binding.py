"""ModelBinding without a ps: the copy path (CUDA's, here on the CPU) brings new values into the
model and keeps the guard honest; the shared path makes parameters views of Shoal's arrays."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.torch.binding import ModelBinding, ModuleState  # noqa: E402
from shoal.torch.errors import TorchTrainError  # noqa: E402


def bound(share):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    binding = ModelBinding(model, torch.optim.SGD(model.parameters(), lr=0.1))
    params = binding.initial_values()
    binding.attach(params, share=share)
    return model, binding, params


def test_copy_path_brings_each_update_into_the_model_and_the_guard_accepts_its_own_copies():
    model, binding, params = bound(share=False)
    assert not binding.shared and model[0].weight.data_ptr() != params["0.weight"].ctypes.data
    for value in (0.5, -1.0):
        model(torch.ones(4, 3)).sum().backward()
        binding.check()
        assert binding.gradients().keys() == params.keys()
        binding.pushed()
        for array in params.values():  # what a push's reply does to the session's arrays
            array.fill(value)
        binding.refresh(params)
        assert torch.equal(model[0].weight, torch.full((2, 3), value))
        model.zero_grad()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    with pytest.raises(TorchTrainError, match="'0.weight' was changed in place"):
        binding.check()


def test_shared_path_makes_parameters_views_of_the_arrays():
    model, binding, params = bound(share=None)
    assert binding.shared
    params["0.bias"][:] = 3.0
    assert torch.equal(model[0].bias, torch.full((2,), 3.0))


def test_buffers_are_the_local_state_and_restore_in_place():
    model, binding, _ = bound(share=None)
    state = ModuleState(model, binding.parameters)
    assert state.names == ("1.running_mean", "1.running_var", "1.num_batches_tracked")
    values = state.values()
    values["1.running_mean"][:] = 7.0
    values["1.num_batches_tracked"] = np.array(12)
    state.restore(values)
    assert torch.equal(model[1].running_mean, torch.full((2,), 7.0)) and int(model[1].num_batches_tracked) == 12


def test_check_refuses_a_replaced_parameter_and_accepts_a_module_put_back():
    model, binding, _ = bound(share=None)
    layer = model[0]
    model[0] = torch.nn.Linear(3, 2)  # another module where the parameter's was
    with pytest.raises(TorchTrainError, match="'0.weight' is not the one DistributedOptimizer was given"):
        binding.check()
    model[0] = layer
    binding.check()
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())  # the parameter itself replaced
    with pytest.raises(TorchTrainError, match="'0.weight' is not the one DistributedOptimizer was given"):
        binding.check()
