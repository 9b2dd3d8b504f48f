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

from shoal.home import shoal_home
from shoal.cli.executors import recorded_executor
from shoal.launch.executor import Executor
from shoal.launch.records import JobStore


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
    stdin: Optional[IO[str]] = None
    interactive: bool = False
    """Someone at a terminal can answer (stdin and stderr are terminals): `shoal train`
    then runs its launcher in the background, follows it, and asks on Ctrl-C."""

    @classmethod
    def from_process(cls) -> "Environment":
        return cls(
            environ=dict(os.environ), stdout=sys.stdout, stderr=sys.stderr,
            stdout_bytes=sys.stdout.buffer, cwd=Path.cwd(), is_tty=sys.stdout.isatty(),
            stdin=sys.stdin, interactive=_isatty(sys.stdin) and _isatty(sys.stderr) and _in_foreground(sys.stdin),
        )

    @property
    def shoal_home(self) -> Path:
        """$SHOAL_HOME, else ~/.shoal: where job records and folders live."""
        return shoal_home(self.environ)

    def store(self) -> JobStore:
        """The job records (open it with `with env.store() as store:`)."""
        return JobStore(self.shoal_home / "jobs.db", note=lambda text: self.say(text, err=True))

    def executor(self, kind: str = "local") -> Executor:
        """A new executor of `kind`, configured from this environment (local: tasks
        inherit it), for the tasks a recorded job names. LaunchError for a kind this shoal
        does not know. (A job started now gets its executor from cli/executors.py.)"""
        return recorded_executor(kind, self)

    def say(self, text: str, *, err: bool = False, end: str = "\n") -> None:
        stream: Optional[IO[str]] = self.stderr if err else self.stdout
        stream.write(text + end)
        stream.flush()


def _isatty(stream: Optional[IO[str]]) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


def _in_foreground(stream) -> bool:
    """Whether this process is in its terminal's foreground process group (a job put in the
    background with `&` may not read the terminal or change its mode: it would be stopped)."""
    try:
        return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
