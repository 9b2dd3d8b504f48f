"""`Environment`: everything a command reads from its surroundings, injected so that tests
can run commands in-process. Built once by `main` (`Environment.from_process`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

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

    @classmethod
    def from_process(cls) -> "Environment":
        return cls(
            environ=dict(os.environ), stdout=sys.stdout, stderr=sys.stderr,
            stdout_bytes=sys.stdout.buffer, cwd=Path.cwd(), is_tty=sys.stdout.isatty(),
        )

    @property
    def shoal_home(self) -> Path:
        """$SHOAL_HOME, else ~/.shoal: where job records and folders live."""
        home = self.environ.get("SHOAL_HOME")
        return Path(home).expanduser() if home else Path.home() / ".shoal"

    def store(self) -> JobStore:
        """The job records (open it with `with env.store() as store:`)."""
        return JobStore(self.shoal_home / "jobs.db")

    def say(self, text: str, *, err: bool = False, end: str = "\n") -> None:
        stream: Optional[IO[str]] = self.stderr if err else self.stdout
        stream.write(text + end)
        stream.flush()
