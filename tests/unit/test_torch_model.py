"""The PyTorch adapter: a CPU module can read a session's params in place."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.train.torch_model import module_gradients, module_variables, share_module_memory  # noqa: E402


def test_shared_module_follows_in_place_updates_of_params():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    params = module_variables(model)
    assert set(params) == set(model.state_dict())
    assert share_module_memory(model, params)
    np.copyto(params["0.weight"], np.full((2, 3), 0.5, np.float32))  # what a pull does
    assert torch.equal(model[0].weight, torch.full((2, 3), 0.5))
    model(torch.ones(4, 3)).sum().backward()
    grads = module_gradients(model)
    assert grads.keys() == params.keys() and grads["0.weight"].shape == (2, 3)
