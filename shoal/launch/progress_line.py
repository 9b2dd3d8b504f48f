"""`ProgressLine`: what the launcher reads from a task's progress line, and `parse_progress`.

The line is the contract between a training program and the launcher (shoal/train/progress.py
prints it; any program may): `step=<global step> loss=<float>` somewhere in a line, optionally
followed by the straggler figures of the worker that printed it::

    worker:1 step=200 loss=0.3012 examples/s=812 step_ms=12.1 p95_ms=19.8 applied=95/100

`step_ms` / `p95_ms`: the median / 95th percentile of its recent local steps' wall time (ms);
`applied=A/P`: of the P gradients it pushed so far, A were applied (the rest were dropped as
stale: sync mode with backup workers). Older lines without them parse too (the figures are
then None). Pure and thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

PROGRESS_RE = re.compile(rb"\bstep=(\d+)\b.*?\bloss=([-+0-9.eE]+|nan|inf)")
"""A progress line from a worker: `step=<global step> loss=<float> ...`."""

_STEP_MS_RE = re.compile(rb"\bstep_ms=([0-9]*\.?[0-9]+)\b")
_P95_MS_RE = re.compile(rb"\bp95_ms=([0-9]*\.?[0-9]+)\b")
_APPLIED_RE = re.compile(rb"\bapplied=(\d+)/(\d+)\b")

_WAITING_RE = re.compile(rb"\bwaiting for ([^(\r\n]*)")
_SILENT_RE = re.compile(rb"\(([^()\r\n]*) does not answer 'status' either\)")
_TASK_RE = re.compile(rb"\b(chief|worker|ps|evaluator):(\d+)\b")


@dataclass(frozen=True)
class ProgressLine:
    """One progress line's figures; the straggler figures are None when the line has none."""

    step: int
    loss: float
    step_ms: Optional[float] = None
    p95_ms: Optional[float] = None
    applied: Optional[int] = None
    pushed: Optional[int] = None


def parse_progress(line: bytes) -> Optional[ProgressLine]:
    """The progress in `line`, or None if it is not a progress line."""
    if b"step=" not in line:
        return None
    match = PROGRESS_RE.search(line)
    if match is None:
        return None
    rest = line[match.end():]
    step_ms = _STEP_MS_RE.search(rest)
    p95_ms = _P95_MS_RE.search(rest)
    applied = _APPLIED_RE.search(rest)
    return ProgressLine(
        step=int(match.group(1)), loss=float(match.group(2)),
        step_ms=float(step_ms.group(1)) if step_ms else None,
        p95_ms=float(p95_ms.group(1)) if p95_ms else None,
        applied=int(applied.group(1)) if applied else None,
        pushed=int(applied.group(2)) if applied else None,
    )


def parse_waiting(line: bytes) -> tuple[str, ...]:
    """The tasks a worker's line says it is waiting for, as task names ("worker.1", "ps.0"),
    or () if the line says no such thing. Reads the lines shoal/train/stalls.py logs while a
    request waits: "worker:0 waiting for worker:1: ps:0: step 12 waits for ..." (a sync step
    waits for worker:1) or "worker:0 waiting for ps:0 at HOST:PORT to answer 'push'" (the ps
    does not answer). When the line adds "(ps:1 does not answer 'status' either)", only the
    ps named there: the others answer, and wait on what waits on it (a sync step)."""
    if b"waiting for " not in line:
        return ()
    match = _WAITING_RE.search(line)
    if match is None:
        return ()
    silent = _SILENT_RE.search(line, match.end())
    named = silent.group(1) if silent is not None else match.group(1).split(b": ", 1)[0]
    return tuple(dict.fromkeys(f"{job.decode()}.{int(index)}" for job, index in _TASK_RE.findall(named)))
