"""bench.mnist_throughput's window: with a progress line every L local steps, the examples in
the window are lines x L x batch, for the job's workers and the bound's copies alike."""

import subprocess
from types import SimpleNamespace

import pytest

from bench.jobrun import Task
from bench.mnist_throughput import BATCH, _measure
from bench.usage import Usage


def worker(name: str, first: float, lines: int, every: int, gap: float) -> Task:
    """A worker whose progress lines (one per `every` local steps) arrive `gap` s apart from `first`."""
    text = [(first + i * gap, f"{name} step={(i + 1) * every} loss=0.3 examples/s=1000") for i in range(lines)]
    text.append((first + lines * gap, "accuracy: 0.9200"))
    usage = Usage(cpu=[(0.0, 0.0), (100.0, 50.0)])
    return Task(name, subprocess.Popen.__new__(subprocess.Popen), lines=text, usage=usage)


@pytest.mark.parametrize("every", [1, 10])
def test_the_window_counts_every_line_as_log_every_steps(every):
    tasks = [worker("worker:0", 1.0, 101, every, 0.01), worker("worker:1", 1.5, 101, every, 0.01)]
    job = SimpleNamespace(tasks=tasks, launched=0.0, sampler=SimpleNamespace(machine_cpu=[(0.0, 0.0), (100.0, 100.0)]))
    run = _measure("softmax", "async", 1000, job, {"worker:0": 0, "worker:1": 0}, 3.0, every)
    assert run["ok"] and run["log_every"] == every and run["local_steps"]["worker:0"] == 101 * every
    # from worker:1's first line (1.5 s) to worker:0's last (2.0 s): 50 lines of worker:0, 50 of worker:1
    assert run["window_s"] == pytest.approx(0.5)
    assert run["examples_per_s"] == pytest.approx(100 * every * BATCH / 0.5, rel=1e-6)
    assert run["cpu_us_per_example"] == pytest.approx(2 * 0.5 * 0.5 / (100 * every * BATCH) * 1e6, rel=1e-2)
