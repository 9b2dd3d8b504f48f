"""`Environment`: everything a command reads from its surroundings, injected so that tests
can run commands in-process. Built once by `main` (`Environment.from_process`); the only
place the process environment is read. It also builds the executors, configured from it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from shoal.cli.executors_slurm import slurm_recorded
from shoal.home import shoal_home
from shoal.launch.errors import LaunchError
from shoal.launch.executor import Executor
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.records import JobStore
from shoal.launch.slurm import KIND as SLURM_KIND


@dataclass(frozen=True)
class Environment:
    """Streams, variables and paths of one `shoal` invocation."""

    environ: Mapping[str, str]
    stdout: IO[str]
    stderr: IO[str]
    stdout_bytes: IO[bytes]
    cwd: Path
    is_tty: bool = False
    python: str = field(default=sys.executable)

    @classmethod
    def from_process(cls) -> "Environment":
        return cls(
            environ=dict(os.environ), stdout=sys.stdout, stderr=sys.stderr,
            stdout_bytes=sys.stdout.buffer, cwd=Path.cwd(), is_tty=sys.stdout.isatty(),
        )

    @property
    def shoal_home(self) -> Path:
        """$SHOAL_HOME, else ~/.shoal: where job records and folders live."""
        return shoal_home(self.environ)

    def store(self) -> JobStore:
        """The job records (open it with `with env.store() as store:`)."""
        return JobStore(self.shoal_home / "jobs.db")

    def executor(self, kind: str = LocalExecutor.kind) -> Executor:
        """A new executor of `kind`, configured from this environment (local: tasks
        inherit it): for a job started now, or the kind a recorded job names (to reach its
        tasks). LaunchError for a kind this shoal does not know."""
        if kind == LocalExecutor.kind:
            return LocalExecutor(python=self.python, base_env=self.environ)
        if kind == SLURM_KIND:
            return slurm_recorded(self)
        raise LaunchError(
            f"the job ran on the {kind!r} executor, which this shoal does not know (it knows"
            f" {LocalExecutor.kind!r}, {SLURM_KIND!r}); use the shoal that started the job"
        )

    def say(self, text: str, *, err: bool = False, end: str = "\n") -> None:
        stream: Optional[IO[str]] = self.stderr if err else self.stdout
        stream.write(text + end)
        stream.flush()
