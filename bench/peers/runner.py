"""A JobSpec's run: start its tasks on 127.0.0.1 through bench/jobrun.py (each in its own
process group, killed by the kernel if the benchmark dies), timestamp every line they print,
sample them (bench/usage.py: peak RSS, private memory, CPU), end the job the way its tasks
end, kill every group. Blocks; not thread-safe.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from bench.jobrun import Job, Launch, Output, Task, clean_env
from bench.peers.systems import End, JobSpec
from bench.usage import UsageSampler


@dataclass
class JobRecord:
    """What one run left: its tasks (lines with arrival times, sampled usage), their exit
    codes (None: killed by us), and the machine's busy CPU time series."""

    spec: JobSpec
    tasks: list[Task]
    codes: dict[str, int | None]
    launched: float
    ended: float
    machine_cpu: list[tuple[float, float]] = field(default_factory=list)
    timed_out: bool = False


def run_job(spec: JobSpec, timeout_s: float, grace_s: float = 10.0) -> JobRecord:
    """Start the tasks in order, wait until the EXITS tasks are done (or one failed, or
    `timeout_s`), give MAY_HANG tasks `grace_s` more, then kill every group. Blocks."""
    job = Job(UsageSampler())
    try:
        for ts in spec.tasks:
            job.start(Launch(ts.name, ts.argv, clean_env(os.environ, ts.env), ts.python, Output.CAPTURE))
        deadline = job.launched + timeout_s
        exiting = [ts.name for ts in spec.tasks if ts.end is End.EXITS]
        codes = job.wait(deadline, exiting, until_failure=True)
        timed_out = not (all(c is not None for c in codes.values()) or any(c not in (None, 0) for c in codes.values()))
        job.wait(min(deadline, time.monotonic() + grace_s), [ts.name for ts in spec.tasks if ts.end is not End.SERVES])
        ended = time.monotonic()
        codes_now = job.poll()
    finally:
        job.close()
    return JobRecord(spec, job.tasks, codes_now, job.launched, ended, job.sampler.machine_cpu, timed_out)
