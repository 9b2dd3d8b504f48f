"""Helpers for in-process CLI tests: `shoal ARGV` with an injected Environment (captured
streams, its own SHOAL_HOME), and job records made without running a job."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Optional

from shoal.cli.environment import Environment
from shoal.cli.main import main
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import JobPlan, make_plan
from shoal.launch.processes import process_started
from shoal.launch.spec import spec_from_dict
from shoal.launch.states import JobState


class Captured:
    """Runs `shoal` in-process; `out` / `err` hold what it printed."""

    def __init__(self, tmp_path: Path, **environ: str):
        self.home = tmp_path / "home"
        self.out = io.StringIO()
        self.err = io.StringIO()
        self.out_bytes = io.BytesIO()
        self.env = Environment(environ={"SHOAL_HOME": str(self.home), **environ},
                               stdout=self.out, stderr=self.err, stdout_bytes=self.out_bytes,
                               cwd=tmp_path)

    def __call__(self, *argv: str) -> int:
        return main(list(argv), self.env)

    def text(self) -> str:
        """Everything printed to stdout, text and bytes."""
        return self.out.getvalue() + self.out_bytes.getvalue().decode()


def record_job(shoal: Captured, job_id: str, name: str = "m", *,
               state: JobState = JobState.SUCCEEDED, running: bool = False,
               workers: int = 1, output_dir: Optional[str] = None, launcher_pid: Optional[int] = None) -> JobPlan:
    """Record a job as a launcher would, with a log line per task; `running`: its launcher
    is this (live) test process, or `launcher_pid`, and the job RUNNING, else the job ended in `state`."""
    spec = spec_from_dict({"name": name, "run": "true", "output_dir": output_dir,
                           "roles": {"worker": {"count": workers}}})
    plan = make_plan(spec, LocalExecutor(python="/py").allocate(spec), job_id=job_id,
                     shoal_home=shoal.home, workdir=shoal.home.parent)
    with shoal.env.store() as store:
        if running:
            pid = launcher_pid or os.getpid()
            store.create_job(plan, pid, process_started(pid) or 0.0)
            store.set_job_state(job_id, JobState.RUNNING)
        else:
            store.create_job(plan, 1, 0.0)
            store.set_job_state(job_id, state, "done", exit_code=0, ended=True)
    for task in plan.tasks:
        Path(task.log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(task.log_path).write_text(f"{job_id} {task.name} says hi\n")
    Path(plan.model_dir).mkdir(parents=True, exist_ok=True)
    return plan
