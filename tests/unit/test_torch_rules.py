"""The ps update rules against torch.optim as the oracle: the rule a torch optimizer maps to,
applied with each param group's lr and weight decay at every step (an LR schedule), gives
torch.optim's parameters to 1e-6; settings the ps cannot run are refused by name."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.ps.optimizers import AdamW, rule_from_config  # noqa: E402
from shoal.torch.errors import TorchTrainError  # noqa: E402
from shoal.torch.rules import check_unchanged, fixed_settings, group_hyper, update_rule  # noqa: E402

SHAPES = [(5, 3), (3,), (4,)]
STEPS = 25


def groups(params, wd_first=0.0, lr_second=None):
    """Two groups: the first with its own weight decay, the second (biases) with its own lr."""
    second = {"params": params[1:]}
    if lr_second is not None:
        second["lr"] = lr_second
    return [{"params": params[:1], "weight_decay": wd_first}, second]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_weight_decay": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.05),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "nesterov_weight_decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01),
    "momentum_groups": lambda p: torch.optim.SGD(groups(p, wd_first=0.1, lr_second=0.02), lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw_groups": lambda p: torch.optim.AdamW(groups(p, wd_first=0.3, lr_second=0.003), lr=0.01),
    "adam_decoupled": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.2, decoupled_weight_decay=True),
}


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_rule_matches_torch_optim_with_a_changing_learning_rate(make):
    rng = np.random.default_rng(0)
    initial = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]

    params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in initial]
    oracle = make(params)
    schedule = torch.optim.lr_scheduler.LambdaLR(oracle, lambda step: 0.9 ** step)
    group_of = {id(p): i for i, g in enumerate(oracle.param_groups) for p in g["params"]}

    rule = update_rule(make([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]))
    assert rule_from_config(rule.to_config()) == rule
    ours = [v.copy() for v in initial]
    states = [rule.init_state(v) for v in ours]
    for step in range(STEPS):
        for p, v, g, state in zip(params, ours, grads[step], states):
            p.grad = torch.from_numpy(g.copy())
            h = group_hyper(oracle.param_groups[group_of[id(p)]], group_of[id(p)])  # read before the step, as a push does
            rule.with_hyper(h.learning_rate, h.weight_decay).apply(v, g.copy(), state)
        oracle.step()
        schedule.step()
    for p, v in zip(params, ours):
        np.testing.assert_allclose(v, p.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_adamw_defaults_are_torch_optim_adamw_defaults():
    p = torch.nn.Parameter(torch.zeros(2))
    assert update_rule(torch.optim.AdamW([p])) == AdamW()


@pytest.mark.parametrize("make, match", [
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1), "dampening"),
    (lambda p: torch.optim.SGD(p, lr=0.1, maximize=True), "maximize"),
    (lambda p: torch.optim.Adam(p, amsgrad=True), "amsgrad"),
    (lambda p: torch.optim.RMSprop(p), r"cannot run torch\.optim\.rmsprop\.RMSprop"),
    (lambda p: torch.optim.SGD([{"params": p[:1], "momentum": 0.5}, {"params": p[1:]}], lr=0.1, momentum=0.9),
     r"param group 1 has momentum=0\.9 but group 0 has 0\.5"),
])
def test_optimizer_the_ps_cannot_run_is_refused_naming_the_setting(make, match):
    with pytest.raises(TorchTrainError, match=match):
        update_rule(make([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]))


def test_changing_a_fixed_setting_during_training_is_refused():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    at_start = fixed_settings(optimizer)
    optimizer.param_groups[0]["lr"] = 0.01  # lr may change
    check_unchanged(at_start, optimizer.param_groups)
    optimizer.param_groups[0]["momentum"] = 0.85  # what OneCycleLR(cycle_momentum=True) does
    with pytest.raises(TorchTrainError, match="momentum changed from 0.9 to 0.85.*cycle_momentum=False"):
        check_unchanged(at_start, optimizer.param_groups)
