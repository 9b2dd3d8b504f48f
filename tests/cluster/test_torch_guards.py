"""The stale-model guard: with an in-process ps (shoal.torch.init with no cluster), the model
follows the ps values, and every way a model can silently stop training under a
DistributedOptimizer is refused with an error that names the parameter and the fix."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shoal.torch  # noqa: E402
from shoal.torch.errors import TorchTrainError  # noqa: E402
from torch import nn  # noqa: E402


@pytest.fixture
def start():
    """Starts a DistributedOptimizer for a small model on an in-process ps; closes them all."""
    jobs, optimizers = [], []

    def make(**optimizer_kw):
        job = shoal.torch.init(None, {})
        jobs.append(job)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        opt = shoal.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, **optimizer_kw), model, job,
                                               request_timeout_s=10)
        optimizers.append(opt)
        return model, opt

    yield make
    for opt in optimizers:
        opt.session.close()
    for job in jobs:
        job.close()


def backward(model):
    model.zero_grad()
    model(torch.ones(5, 3)).pow(2).sum().backward()


def test_model_shares_the_ps_values_and_follows_each_step(start):
    model, opt = start()
    before = model[0].weight.detach().clone()
    backward(model)
    grad = model[0].weight.grad.clone()
    opt.step()
    torch.testing.assert_close(model[0].weight.detach(), before - 0.1 * grad)
    params = opt.session.params["0.weight"]
    assert model[0].weight.data_ptr() == params.ctypes.data  # a view of Shoal's copy: no copy per step
    assert opt.global_step == 1


def test_step_without_backward_is_refused(start):
    model, opt = start()
    opt.zero_grad()
    with pytest.raises(TorchTrainError, match=r"no gradients: call loss\.backward\(\) before opt\.step\(\)"):
        opt.step()


def test_second_step_without_a_new_backward_is_refused(start):
    model, opt = start()
    backward(model)
    opt.step()
    with pytest.raises(TorchTrainError, match="again without a new loss.backward"):
        opt.step()
    backward(model)
    opt.step()  # a new backward: fine
    assert opt.global_step == 2


def test_replaced_layer_is_refused_naming_the_parameter(start):
    model, opt = start()
    model[0] = nn.Linear(3, 4)
    backward(model)
    with pytest.raises(TorchTrainError, match=r"'0\.weight' is not the one DistributedOptimizer was given"):
        opt.step()


def test_parameter_data_replaced_is_refused(start):
    model, opt = start()
    model[0].weight.data = model[0].weight.data.clone()  # what model.to(another device) does to each parameter
    backward(model)
    with pytest.raises(TorchTrainError, match=r"'0\.weight' no longer holds Shoal's values.*model\.to"):
        opt.step()


def test_weights_loaded_after_creation_are_refused(start):
    model, opt = start()
    model.load_state_dict({k: torch.zeros_like(v) for k, v in model.state_dict().items()})
    backward(model)
    with pytest.raises(TorchTrainError, match=r"'0\.weight' was changed in place.*load weights before"):
        opt.step()


def test_step_after_finish_is_refused_and_finish_is_idempotent(start):
    model, opt = start()
    backward(model)
    opt.step()
    opt.finish()
    opt.finish()
    backward(model)
    with pytest.raises(TorchTrainError, match="step\\(\\) on a DistributedOptimizer that is closed"):
        opt.step()
    assert np.all(np.isfinite(model[0].weight.detach().numpy()))


def test_lr_scheduler_drives_the_pushed_learning_rate(start):
    model, opt = start()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    for lr in (0.1, 0.01):
        before = model[2].bias.detach().clone()
        backward(model)
        grad = model[2].bias.grad.clone()
        opt.step()
        scheduler.step()
        torch.testing.assert_close(model[2].bias.detach(), before - lr * grad)
