"""Shoal's steps to 0.90 test accuracy, without changing its examples: they evaluate once, at
the end. Training does not depend on the run's length (no schedule), so a run of S global
steps ends with the parameters a longer run has at step S. We run the example to S = 2, 4,
8, ... evaluation strides (a stride is 5,000 examples, as the peers' evaluations), then bisect
between the last S below 0.90 and the first at or above it, to one stride. S90 is that first
S; the (S, accuracy) points also draw Shoal's curve of accuracy against time.

The accuracy is the chief's (worker:0's) `accuracy:` line. Async runs differ from run to run,
so near the threshold S90 is good to about a stride. Blocks.
"""

from __future__ import annotations

from typing import Callable

from bench.peers import metrics, systems
from bench.peers.runner import run_job

TARGET = 0.90


def find_s90(system: systems.System, model: str, ctx: systems.Context, stride_examples: int, timeout_s: float,
             max_examples: int, log: Callable[[str], None] = print) -> dict:
    """{"s90": global step or None, "points": [(step, accuracy)], "runs": n}."""
    stride = max(1, stride_examples // system.examples_per_step())
    points: dict[int, float] = {}

    def accuracy_at(steps: int) -> float | None:
        spec = systems.build(system, model, steps * system.examples_per_step(), ctx, log_every=1_000_000)
        record = run_job(spec, timeout_s)
        acc = metrics.final_accuracy(record) if metrics.ok_exits(record) else None
        log(f"    ladder {system.name} {model}: {steps} steps -> accuracy {acc}")
        if acc is not None:
            points[steps] = acc
        return acc

    low, high = 0, None
    steps = 2 * stride
    while steps * system.examples_per_step() <= max_examples:
        acc = accuracy_at(steps)
        if acc is None:
            break
        if acc >= TARGET:
            high = steps
            break
        low, steps = steps, steps * 2
    while high is not None and high - low > stride:
        middle = (low + high) // 2 // stride * stride
        if middle <= low:
            break
        acc = accuracy_at(middle)
        if acc is None:
            break
        if acc >= TARGET:
            high = middle
        else:
            low = middle
    return {"s90": high, "points": sorted(points.items()), "runs": len(points)}
