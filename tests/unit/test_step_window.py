"""StepWindow (the progress line's step times, kept sorted) against step_time_ms over the same
times (the oracle: sort the window every time)."""

import random

import pytest

from shoal.train.progress import step_time_ms
from shoal.train.step_window import StepWindow


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_step_window_figures_equal_sorting_the_last_steps_as_it_slides(size):
    rng = random.Random(size)
    window, times = StepWindow(size), []
    assert window.figures_ms() == (0.0, 0.0)
    for _ in range(3 * size + 7):
        seconds = rng.choice([0.001, 0.002, 0.5]) if rng.random() < 0.3 else rng.random() / 100  # with repeats
        window.add(seconds)
        times.append(seconds)
        assert window.figures_ms() == step_time_ms(times[-size:])
        assert len(window) == min(len(times), size)


def test_step_window_refuses_a_size_below_one():
    with pytest.raises(ValueError, match="size=0"):
        StepWindow(0)
