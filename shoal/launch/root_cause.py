"""The root cause of a failed job: the first task that failed for good, how (exit code or
signal), when, and the last lines of its output (as torchrun's "Root Cause (first observed
failure)").

Every other task of a failed job is stopped by the launcher and prints its own complaint
(a worker whose ps died reports the lost ps), so the cause is usually buried above. The
supervisor records the first failure (`TaskFailure`, in its `JobResult`); at the end of the
run `RootCause` adds the tail of that task's log file and is printed as the job's last lines
and kept beside the job's logs (`root_cause.json`), where `shoal status JOB` finds it.

`TaskFailure` and `RootCause` are immutable and thread-safe; reading a log tail and saving or
loading the file block on the file system.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from shoal.launch.errors import WorkspaceError
from shoal.launch.files import private_file

FILE_NAME = "root_cause.json"
TAIL_LINES = 15
"""Lines of the failed task's output shown (a whole traceback when it ends one, up to MAX_TRACEBACK)."""
MAX_TRACEBACK = 40
_TAIL_BYTES = 64 << 10
_RULE = "=" * 64


@dataclass(frozen=True)
class TaskFailure:
    """A task that failed for good. `exit_code` is -N when signal N killed it, None when it
    never started; `detail` says the same in words ("exit 1", "killed by SIGKILL", or why it
    could not start); `at` is the wall-clock time (time.time()) it was seen."""

    task: str
    label: str
    exit_code: Optional[int]
    detail: str
    at: float
    log_path: str = ""


@dataclass(frozen=True)
class RootCause:
    """A failure and the last lines of the failed task's output."""

    failure: TaskFailure
    last_lines: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The block, one string per line."""
        f = self.failure
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.at))
        out = [_RULE, "Root cause (first observed failure):",
               f"  task:      {f.label}",
               f"  exit:      {f.detail}",
               f"  time:      {when}"]
        if f.log_path:
            out.append(f"  log:       {f.log_path}")
        if self.last_lines:
            out.append("  last lines of its output:")
            out.extend(f"    {line}" for line in self.last_lines)
        elif f.log_path:
            out.append("  (it printed nothing)")
        out.append(_RULE)
        return out

    def format(self, prefix: str = "") -> str:
        return "\n".join(f"{prefix}{line}".rstrip() for line in self.lines())

    def as_json(self) -> dict:
        return {**asdict(self.failure), "last_lines": list(self.last_lines)}

    @classmethod
    def from_json(cls, data: dict) -> "RootCause":
        fields = {k: data[k] for k in ("task", "label", "exit_code", "detail", "at", "log_path") if k in data}
        return cls(TaskFailure(**fields), tuple(str(line) for line in data.get("last_lines", ())))


def root_cause(failure: TaskFailure) -> RootCause:
    """The failure with the last lines of its task's log file (none if it cannot be read)."""
    return RootCause(failure, tuple(tail_of(Path(failure.log_path)) if failure.log_path else ()))


def tail_of(path: Path) -> list[str]:
    """The last lines of a task's output: from the start of its last Python traceback if that
    is at most MAX_TRACEBACK lines from the end, else the last TAIL_LINES lines. Reads at most
    64 KiB; [] if the file cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > _TAIL_BYTES and lines:
        lines = lines[1:]  # the first one is probably cut
    while lines and not lines[-1].strip():
        lines.pop()
    for i in range(len(lines) - 1, max(-1, len(lines) - MAX_TRACEBACK - 1), -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            return lines[i:]
    return lines[-TAIL_LINES:]


def report_root_cause(failure: Optional[TaskFailure], job_dir: str | Path,
                      note: Callable[[str], None]) -> Optional[RootCause]:
    """At the end of a failed job: show the root cause of `failure` through `note` (one line
    per call, "shoal | " prefixed) and keep it in `job_dir`. Returns it (None without a
    failure). Blocks on the file system; a file that cannot be written is only noted."""
    if failure is None:
        return None
    cause = root_cause(failure)
    for line in cause.lines():
        note(f"shoal | {line}".rstrip())
    try:
        save_root_cause(cause, job_dir)
    except WorkspaceError as e:
        note(f"shoal | (not kept for shoal status: {e})")
    return cause


def save_root_cause(cause: RootCause, job_dir: str | Path) -> Path:
    """Write `cause` to the job's folder (0600). Blocks; raises WorkspaceError."""
    path = Path(job_dir) / FILE_NAME
    fix = "set SHOAL_HOME to a writable directory (default ~/.shoal)"
    private_file(path, "the job's root cause", fix)
    try:
        path.write_text(json.dumps(cause.as_json(), indent=1))
    except OSError as e:
        path.unlink(missing_ok=True)  # no half-written file for shoal status to misread
        raise WorkspaceError(f"cannot write the job's root cause {path}: {e.strerror or e}; {fix}") from e
    return path


def load_root_cause(job_dir: str | Path) -> Optional[RootCause]:
    """The root cause kept in the job's folder, or None (none kept, or unreadable)."""
    try:
        return RootCause.from_json(json.loads((Path(job_dir) / FILE_NAME).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
