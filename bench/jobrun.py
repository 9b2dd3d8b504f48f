"""The one job runner of bench/: start a benchmark's named tasks, wait for them, kill them.

Every process a benchmark starts goes through a `Job`. Each task is

- `program argv...` (program: this interpreter unless the Launch names another, e.g. the
  peers' virtualenv) run from the repository root with exactly the environment given
  (`clean_env` builds one from the benchmark's own);
- the leader of a process group of its own, so that killing the group also kills whatever the
  task started;
- killed by the kernel (PR_SET_PDEATHSIG, Linux) if the benchmark dies, even by SIGKILL;
- captured (stdout and stderr as one stream, every line kept with its arrival time),
  discarded, or left on the benchmark's own terminal;
- optionally sampled by a `bench.usage.UsageSampler`, which is where "peak RSS" is defined
  for every bench report.

`Job.close()` kills every group and is called in `finally`. What is measured stays in each
benchmark; only these mechanics are shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from bench import REPO
from bench.usage import SAMPLE_PERIOD_S, Usage, UsageSampler
from shoal.launch.parent_death import die_with_parent

# Variables that would make a task join another job or behave unlike the benchmark means it
# to: Shoal's own (job secret, home), TensorFlow's cluster, the examples' --model_dir default
# (checkpoints and summaries), torch.distributed's rendezvous.
DROPPED_PREFIXES = ("SHOAL_",)
DROPPED = ("TF_CONFIG", "OUTPUT_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

class JobRunError(RuntimeError):
    """A benchmark asked the job runner for something it cannot do."""


class Output(Enum):
    """Where a task's stdout and stderr go."""

    CAPTURE = "capture"  # one pipe; every line kept in Task.lines with its arrival time
    DISCARD = "discard"  # /dev/null
    INHERIT = "inherit"  # the benchmark's own stdout and stderr


class JobState(Enum):
    """NEW -> RUNNING (first start) -> CLOSED (close); NEW -> CLOSED. CLOSED is final."""

    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


def clean_env(base: Mapping[str, str], add: Mapping[str, str] | None = None) -> dict[str, str]:
    """A task's environment: `base` (the benchmark's, read at its edge) without SHOAL_*,
    TF_CONFIG, OUTPUT_DIR and torch.distributed's variables, then `add`, and
    PYTHONUNBUFFERED=1 so that lines arrive when they are printed."""
    env = {k: v for k, v in base.items() if not k.startswith(DROPPED_PREFIXES) and k not in DROPPED}
    env.update(add or {})
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class Launch:
    """Blueprint of one task: `program argv...` from the repository root, with exactly `env`."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    program: str = sys.executable
    output: Output = Output.INHERIT


@dataclass(eq=False)
class Task:
    """A started task. A reader thread appends to `lines` (Output.CAPTURE) and the job's
    sampler writes `usage`: read both after `Job.close()`."""

    name: str
    proc: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)  # (monotonic arrival time, line)
    usage: Usage = field(default_factory=Usage)
    reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, n: int = 15) -> str:
        """The last `n` lines captured."""
        return "\n".join(line for _, line in self.lines[-n:])

    def _read(self) -> None:
        with self.proc.stdout as stream:
            for line in stream:
                self.lines.append((time.monotonic(), line.rstrip("\n")))


class Job:
    """A benchmark's set of named tasks on this machine. Lifecycle: `start` the tasks (in the
    order given), `wait` for them, `close` (kills every group; idempotent, safe in `finally`;
    also `with Job() as job:`). With a `sampler`, every task is sampled from its start; the
    job starts the sampler with its first task and closes it in `close`.

    Not thread-safe: one thread drives a job. Start tasks from a thread that outlives them
    (the kernel's parent-death signal fires when the starting *thread* exits). The
    constructor does no I/O."""

    def __init__(self, sampler: UsageSampler | None = None, cwd: Path = REPO) -> None:
        self.sampler = sampler
        self.cwd = cwd
        self.tasks: list[Task] = []
        self.launched: float | None = None  # monotonic time just before the first task started
        self._state = JobState.NEW

    @property
    def state(self) -> JobState:
        return self._state

    def start(self, launch: Launch) -> Task:
        """Start one task. Blocks for the fork/exec only."""
        if self._state is JobState.CLOSED:
            raise JobRunError(f"cannot start task {launch.name!r}: its job is closed; make a new Job")
        if any(t.name == launch.name for t in self.tasks):
            raise JobRunError(f"task {launch.name!r} was already started in this job; give each task its own name")
        if self.launched is None:
            self.launched = time.monotonic()
        streams = {Output.CAPTURE: {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
                                    "bufsize": 1, "errors": "replace"},
                   Output.DISCARD: {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL},
                   Output.INHERIT: {}}[launch.output]
        try:
            proc = subprocess.Popen([launch.program, *launch.argv], cwd=self.cwd, env=dict(launch.env),
                                    start_new_session=True, preexec_fn=die_with_parent(os.getpid()), **streams)
        except OSError as e:
            raise JobRunError(f"cannot start task {launch.name!r} ({launch.program} ...): {e}; check that "
                              "the program exists and is executable") from e
        task = Task(launch.name, proc)
        self.tasks.append(task)
        self._state = JobState.RUNNING
        if launch.output is Output.CAPTURE:
            task.reader = threading.Thread(target=task._read, name=f"bench-read-{launch.name}", daemon=True)
            task.reader.start()
        if self.sampler is not None:
            self.sampler.watch(proc, task.usage)
            self.sampler.start()
        return task

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise JobRunError(f"no task {name!r} in this job (it has {', '.join(t.name for t in self.tasks) or 'none'})")

    def poll(self) -> dict[str, int | None]:
        """Each task's exit status, None while it runs. Does not block."""
        return {t.name: t.proc.poll() for t in self.tasks}

    def wait(self, deadline: float, names: Iterable[str] | None = None,
             until_failure: bool = False) -> dict[str, int | None]:
        """Block until the named tasks (default: all) have exited, or, with `until_failure`,
        one of them has exited non-zero, or time.monotonic() reaches `deadline`. Returns
        their exit statuses, None for those still running. Kills nothing."""
        tasks = [self.task(n) for n in names] if names is not None else list(self.tasks)
        while True:
            codes = {t.name: t.proc.poll() for t in tasks}
            done = all(c is not None for c in codes.values())
            failed = until_failure and any(c not in (None, 0) for c in codes.values())
            left = deadline - time.monotonic()
            if done or failed or left <= 0:
                return codes
            time.sleep(min(SAMPLE_PERIOD_S, left))

    def close(self, grace_s: float = 0.0) -> None:
        """Stop the sampler, then end every task's process group: SIGTERM and up to `grace_s`
        for them to exit when `grace_s` > 0, then SIGKILL; reap the tasks and join their
        readers. Blocks up to `grace_s` + a few seconds. Idempotent."""
        if self._state is JobState.CLOSED:
            return
        self._state = JobState.CLOSED
        if self.sampler is not None:
            self.sampler.close()
        if grace_s > 0:
            for t in self.tasks:
                if t.proc.poll() is None:
                    _signal_group(t.proc, signal.SIGTERM)
            self.wait(time.monotonic() + grace_s)
        for t in self.tasks:
            _signal_group(t.proc, signal.SIGKILL)  # the group may outlive its leader
        for t in self.tasks:
            try:
                t.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for t in self.tasks:
            if t.reader is not None:
                t.reader.join(5)  # a process that left the group may still hold the pipe

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
