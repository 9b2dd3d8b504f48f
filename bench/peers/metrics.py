"""Figures of one run, from what its tasks printed (with arrival times) and what was sampled.
The same rules for every system; pure functions of a JobRecord.

    examples/s     Progress lines (`step=N examples=E`, or Shoal's `step=N loss=X examples/s=R`
                   standing for one batch of 100; for Shoal's coordinator, whose chief prints
                   one per finished dispatch, for K batches) counted while every printing task trains
                   steadily: from the latest of their lines at WARMUP of their count to the
                   earliest of their last lines; sum of E in that window / its length.
    first step     Launch of the first process to the arrival of the slowest printer's first
                   progress line (interpreter, imports, data, connecting, init, one step).
                   Peers' test evaluations (chief, every 5,000 examples until 0.90) are taken
                   out of the window: their seconds are subtracted from its length.
    time to 0.90   Launch to the arrival of the first progress line whose global step reaches
                   S90, the global step at which the test accuracy first reaches 0.90, less
                   the seconds of the peer's evaluations before it. Peers find S90 by
                   evaluating during the run; Shoal's comes from runs of fixed length
                   (bench/peers/ladder.py), so its runs carry no evaluation at all.
    CPU s / 1k ex  CPU time of all the job's processes (and their children) in the window, less
                   the evaluations' seconds, per 1,000 examples of the window.
    peak RSS       as defined for every bench report in bench/usage.py: the peak, over samples
                   every 50 ms, of the sum of psutil RSS over the task's process and all its
                   children; the max per role (ps, worker, chief). `peak_private_mb` (JSON)
                   is the same peak of private memory (RSS minus shared pages).
"""

from __future__ import annotations

import os
import re

from bench.peers.runner import JobRecord
from bench.peers.systems import End
from bench.usage import SAMPLE_PERIOD_S, interpolate

WARMUP = 0.1  # share of each printer's progress lines left out at the start
PROGRESS = re.compile(r"\bstep=(\d+) (?:loss=\S+ examples/s=\d+|examples=(\d+))")
EVAL = re.compile(r"\beval_step=(\d+) accuracy=(\d\.\d+) eval_s=(\d+\.\d+)")
ACCURACY = re.compile(r"^accuracy: (\d\.\d+)")
TARGET = 0.90
MB = 1e6


def progress(record: JobRecord) -> dict[str, list[tuple[float, int, int]]]:
    """Per task that printed progress: [(arrival time, global step, examples)]."""
    out = {}
    for task in record.tasks:
        rows = []
        for t, line in task.lines:
            m = PROGRESS.search(line)
            if m:
                rows.append((t, int(m.group(1)), int(m.group(2) or record.spec.line_examples)))
        if rows:
            out[task.name] = rows
    return out


def evaluations(record: JobRecord) -> list[tuple[float, int, float, float]]:
    """[(arrival time, global step, test accuracy, seconds the evaluation took)] in order."""
    return [(t, int(m.group(1)), float(m.group(2)), float(m.group(3)))
            for task in record.tasks for t, line in task.lines if (m := EVAL.search(line))]


def final_accuracy(record: JobRecord) -> float | None:
    found = [float(m.group(1)) for task in record.tasks for _, line in task.lines if (m := ACCURACY.search(line))]
    return found[0] if found else None


def time_of_step(rows: dict[str, list[tuple[float, int, int]]], step: int) -> float | None:
    """Arrival of the first progress line (any task) at or past global `step`."""
    times = [t for r in rows.values() for t, s, _ in r if s >= step]
    return min(times) if times else None


def ok_exits(record: JobRecord) -> bool:
    """Every EXITS task exited 0 in time (MAY_HANG and SERVES tasks are judged by output)."""
    ends = {t.name: t.end for t in record.spec.tasks}
    return not record.timed_out and all(record.codes.get(n) == 0 for n, e in ends.items() if e is End.EXITS)


def ok(record: JobRecord) -> bool:
    """ok_exits, and progress was printed."""
    return ok_exits(record) and bool(progress(record))


def measure(record: JobRecord, s90: int | None = None, ladder_points=()) -> dict:
    """The figures of one run. `s90`: Shoal's global step to 0.90 (peers find theirs in their
    output); `ladder_points`: Shoal's (global step, accuracy) pairs, placed on this run's clock."""
    spec = record.spec
    run: dict = {"system": spec.system, "model": spec.model, "steps": spec.steps, "ok": ok(record),
                 "exit_codes": record.codes, "timed_out": record.timed_out,
                 "wall_s": round(record.ended - record.launched, 2),
                 "peak_rss_mb": {t.name: round(t.usage.peak_rss / MB, 1) for t in record.tasks},
                 "peak_private_mb": {t.name: round(t.usage.peak_private / MB, 1) for t in record.tasks}}
    for role in ("ps", "worker", "chief"):
        values = [t.usage.peak_rss / MB for t in record.tasks if t.name.startswith(role)]
        run[f"peak_rss_mb_{role}"] = round(max(values), 1) if values else None
    rows = progress(record)
    if not run["ok"]:
        run["error"] = {t.name: t.tail(25) for t in record.tasks}
        return run
    firsts = [r[min(len(r) - 1, int(len(r) * WARMUP))][0] for r in rows.values()]
    start, end = max(firsts), min(r[-1][0] for r in rows.values())
    examples = sum(e for r in rows.values() for t, _, e in r if start < t <= end)
    evals = evaluations(record)
    # a peer's test evaluations stall its chief (and, when synchronous, everyone): their time
    # is taken out of the window. Asynchronous peers keep training on the other workers
    # meanwhile, so this flatters them a little; Shoal's runs have no evaluation to take out.
    eval_in_window = sum(secs for t, _, _, secs in evals if start < t <= end)
    window = end - start - eval_in_window
    cpu = sum(interpolate(t.usage.cpu, end) - interpolate(t.usage.cpu, start) for t in record.tasks)
    cpu_measurable = end - start >= 4 * SAMPLE_PERIOD_S  # else the 50 ms samples cannot resolve it
    cores = os.cpu_count() or 1
    others = interpolate(record.machine_cpu, end) - interpolate(record.machine_cpu, start) - cpu
    if s90 is None:
        s90 = next((s for _, s, acc, _ in evals if acc >= TARGET), None)
        curve = [(s, acc) for _, s, acc, _ in evals]
    else:
        curve = list(ladder_points)
    t90 = time_of_step(rows, s90) if s90 is not None else None
    if t90 is not None:  # without the time the peer spent on evaluations before it got there
        t90 -= sum(secs for t, s, _, secs in evals if s < s90 and t < t90)
    run.update({
        "examples_per_s": round(examples / window) if window > 0 else None,
        "window_s": round(end - start, 3),
        "window_examples": examples,
        "first_step_s": round(max(r[0][0] for r in rows.values()) - record.launched, 3),
        "s90": s90,
        "time_to_090_s": round(t90 - record.launched, 3) if t90 is not None else None,
        # evaluation ran on one thread of the chief: its seconds are not training CPU
        "cpu_s_per_1k_examples": round(max(0.0, cpu - eval_in_window) / examples * 1000, 4)
        if examples and cpu_measurable else None,
        "cpu_share_ours": round(cpu / (window * cores), 2) if window > 0 else None,
        "cpu_share_others": round(max(0.0, others) / (window * cores), 2) if window > 0 else None,
        "eval_s_in_window": round(eval_in_window, 3),
        "accuracy": final_accuracy(record),
        "accuracy_curve": [(round(t - record.launched, 3), acc) for s, acc in curve
                           if (t := time_of_step(rows, s)) is not None],
        "last_step": max(r[-1][1] for r in rows.values()),
    })
    return run
