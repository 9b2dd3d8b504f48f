"""Checks of a planned job before any of its tasks starts, for mistakes that would otherwise
show as every task failing the same way (or, with a restart policy, failing again and again):

- a Python script that does not exist (`python missing.py`): one error naming the path;
- a Shoal program (its script imports shoal and trains on, or serves, parameter servers) in a
  job with no ps task: its workers could not
  train (`shoal run` therefore gives a Shoal program one ps unless told otherwise,
  `default_ps`).

"The script" of a command is its first Python script argument: `python [options] SCRIPT ...`
(any python/python3.X interpreter; `-m MODULE` finds the module's file under the workdir when
it is there; `-c` has none), or the command itself when it is a `.py` file. Commands that are
not Python are not checked. Only tasks that run on this machine (the local executor) are
checked: another host's files are its own (the ssh executor checks its hosts' workdir and
interpreter, shoal/launch/ssh_preflight.py).

Reads files; no processes, no network. Thread-safe.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

from shoal.launch.errors import SpecError
from shoal.launch.plan import JobPlan
from shoal.launch.spec import JobSpec

_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_LONG_WITH_VALUE = {"--check-hash-based-pycs"}
_IMPORTS_SHOAL = re.compile(rb"^[ \t]*(import[ \t]+shoal\b|from[ \t]+shoal(\.[\w.]+)?[ \t]+import\b)", re.MULTILINE)
# What a program that trains on (or serves as) a ps calls; a script that only borrows a helper
# (shoal.datasets, say) is not a Shoal training program.
_USES_PS = re.compile(rb"\b(TrainingSession|serve_unless_training|Server\.for_task|shoal\.Server|shoal\.torch|"
                      rb"DistributedOptimizer|create_local_server)\b")
_READ_AT_MOST = 1 << 20
TRAINING_JOBS = ("chief", "worker")


class PreflightError(SpecError):
    """A job would fail in every task: its command names a script that does not exist, or it
    runs a Shoal program without a ps. Found before anything started."""


def script_of(argv: Sequence[str], workdir: Path) -> Optional[Path]:
    """The Python script `argv` runs (absolute, resolved against `workdir`), or None when it
    runs no script file of its own (not Python, `-c`, `-m` of an installed module, stdin)."""
    if not argv:
        return None
    if argv[0].endswith(".py"):
        return workdir / argv[0]
    if not _PYTHON.match(Path(argv[0]).name):
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            following = next(args, None)
            return workdir / following if following else None
        if arg == "-" or not arg.startswith("-"):
            return None if arg == "-" else workdir / arg
        if arg.startswith("--"):
            if arg in _LONG_WITH_VALUE:
                next(args, None)
            continue
        for i, flag in enumerate(arg[1:], start=1):  # a cluster of short options: -uc, -Wignore
            if flag in "cmWX":
                value = arg[i + 1:] or next(args, "")
                if flag == "c":
                    return None
                if flag == "m":
                    return _module_file(value, workdir)
                break  # -W/-X took the rest as their value
    return None


def is_shoal_program(argv: Sequence[str], workdir: Path) -> bool:
    """Whether `argv` runs a script that imports shoal and trains on (or serves) parameter
    servers: TrainingSession, shoal.Server, serve_unless_training, shoal.torch (read from its
    first MiB)."""
    script = script_of(argv, workdir)
    if script is None:
        return False
    try:
        with open(script, "rb") as f:
            text = f.read(_READ_AT_MOST)
    except OSError:
        return False
    return bool(_IMPORTS_SHOAL.search(text) and _USES_PS.search(text))


def default_ps(argv: Sequence[str], workdir: Path) -> int:
    """How many ps `shoal run` starts when `--ps` is not given: 1 for a Shoal program, else 0."""
    return 1 if is_shoal_program(argv, workdir) else 0


def check_plan(plan: JobPlan, spec: JobSpec, *, local: bool, no_ps_asked: bool = False) -> None:
    """Raise PreflightError for the first problem found in `plan`, made from `spec` (see the module
    docstring; the error names the spec's file, line and field where it came from a file);
    `local`: the tasks run on this machine; `no_ps_asked`: the user asked for no ps in so many
    words (`shoal run --ps 0`), so a Shoal program without one is theirs to run. Blocks on the
    file system only."""
    if not local:
        return
    workdir = Path(plan.workdir)
    if not workdir.is_dir():
        what = "is not a directory" if workdir.exists() else "does not exist"
        raise _error(spec, "workdir", f"the job's workdir {workdir} {what}; fix workdir: in the spec (relative "
                     "paths start in the directory shoal was started in), or leave it out to run where shoal runs;"
                     " nothing was started")
    seen: set[tuple[str, ...]] = set()
    for task in plan.tasks:
        if task.argv in seen:
            continue
        seen.add(task.argv)
        script = script_of(task.argv, workdir)
        if script is not None and not script.is_file():
            what = "is a directory, not a script" if script.is_dir() else "does not exist"
            raise _error(
                spec, spec.command_field(task.task.job),
                f"{task.label} would run {script}, which {what} (relative paths start in the job's workdir, "
                f"{workdir}); fix the path in the command (after -- or the spec's run:), or start shoal in the"
                " directory it is relative to, or set workdir: in the spec; nothing was started")
    has_ps = no_ps_asked or any(t.task.job == "ps" for t in plan.tasks)
    for task in plan.tasks:
        if not has_ps and task.task.job in TRAINING_JOBS and is_shoal_program(task.argv, workdir):
            raise _error(
                spec, "roles.ps",
                f"{task.label} runs {script_of(task.argv, workdir)}, a Shoal program (it trains on parameter "
                "servers), but the job has no ps task to hold its variables; add one (shoal run --ps 1, or a ps: "
                "role in the spec; shoal run --ps 0 runs it anyway); nothing was started")


def _error(spec: JobSpec, field: str, message: str) -> PreflightError:
    """A PreflightError about `field` of `spec`, at its file and line when it came from a file."""
    source, line = spec.located(field)
    return PreflightError(message, source=source, line=line, field=field)


def _module_file(module: str, workdir: Path) -> Optional[Path]:
    """The file of `python -m module` if it lies under `workdir` (else it is installed: None)."""
    if not module:
        return None
    base = workdir.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None
