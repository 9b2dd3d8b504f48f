"""bench.step_budget's pure parts: CPU per step from two runs, and which configurations run."""

import pytest

from bench.step_budget import configurations, main, per_step


def test_per_step_takes_the_start_up_out_by_the_difference_of_two_runs():
    short = {"ps": 0.40, "worker": 1.10}  # 1000 steps: start-up + 1000 steps
    long = {"ps": 1.30, "worker": 3.10}   # 11000 steps: the same start-up + 11000 steps
    step = per_step(short, long, 10000)
    assert step == pytest.approx({"ps": 90.0, "worker": 200.0})


def test_configurations_give_static_sharding_only_to_an_example_that_has_the_flag():
    configs = configurations(["softmax", "mlp"], ["async", "async-overlap"])
    assert ("softmax", "async", "static") in configs and ("softmax", "async-overlap", "leased") in configs
    assert ("mlp", "async", "leased") in configs
    assert not any(c[0] == "mlp" and c[2] == "static" for c in configs)
    assert len(configs) == 6


def test_an_unknown_example_is_refused_by_name_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        main(["--examples", "softmax,resnet"])
    assert "unknown example 'resnet'; choose from softmax, mlp" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--steps", "2000"], "softmax: --base-steps (2000) must be at least 1 and fewer than --steps (2000)"),
    (["--examples", "mlp", "--base-steps", "0"], "mlp: --base-steps (0) must be at least 1"),
])
def test_a_short_run_not_shorter_than_the_long_one_is_refused_before_anything_runs(argv, said, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert said in capsys.readouterr().err
