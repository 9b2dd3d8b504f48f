"""`JobSpec`: what a job is — its command, roles, restart policy and deadline.

Loaded once at the edge from a YAML file (`load_spec`) or built from flags
(`spec_from_dict`), validated by pydantic, then immutable. Errors are `SpecError`s that
name the file, the line and the field. No processes, no environment reads here.

YAML form::

    name: mnist
    parameters: {steps: 200}
    run: python examples/mnist_softmax.py --steps {{ steps }}
    roles:
      ps: {count: 2}
      worker: {count: 2, cpus: 1, memory: 2GiB, gpus: 0, env: {FOO: bar}}
    restart: {policy: on-failure, max_restarts: 2, backoff: 1s}
    deadline: 10m
    hosts: [node1, {name: node2, slots: 4}]      # ssh destinations; default: this machine
    ssh: {config: ~/.ssh/config, connect_timeout: 10s, heartbeat_timeout: 10s}
    sync: false                                  # true: rsync the workdir to every host first
    watchdog: {stall: 5m, action: fail, max_restarts: 3}   # progress watchdog (shoal/launch/watchdog.py)
"""

from __future__ import annotations

import difflib
import math
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional, Union, get_args

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ByteSize, ConfigDict, Field, PrivateAttr,
                      ValidationError, field_validator, model_validator)

from shoal.cluster import JOBS
from shoal.launch.errors import SpecError
from shoal.launch.hosts import Host, host_name_problem
from shoal.launch.template import dotted, parse_overrides, render_tree

_DURATION_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_MEMORY_RE = re.compile(r"\s*[0-9]*\.?[0-9]+\s*[A-Za-z]*\s*")
_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
_PARAMETER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RANGE_RE = re.compile(r"\s*([0-9]+)\s*\.\.\s*([0-9]+)\s*")
SCALABLE_ROLES = ("worker", "ps")
"""The roles whose count may be a range MIN..MAX (`shoal scale` changes it while the job runs;
a ps count only grows: shoal/launch/scaling.py)."""

MAX_DEPTH = 32
"""How deep a YAML spec may nest mappings and lists (a job spec needs about 4)."""

MAX_ALIAS_NODES = 1000
"""How many nodes YAML aliases (`*name`) may add to a spec, all together."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like "500ms", "30s", "10m", "1h", "7d"."""
    if isinstance(value, bool) or value is None:
        said = "null" if value is None else repr(value)  # as YAML wrote it
        raise ValueError(f"{said} is not a duration; write e.g. 30s, 10m or 1h")
    if isinstance(value, (int, float)):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 10m or 1h")
    else:
        match = _DURATION_RE.fullmatch(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 10m or 1h")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"duration {value!r} is negative; give 0 or more, e.g. 5s")
    return seconds


_AS_DURATION = BeforeValidator(parse_duration)
Duration = Annotated[float, _AS_DURATION]
"""A spec field of seconds, written as a number or as "500ms", "30s", "10m", "1h", "7d"."""


def _memory_shape(value: Any) -> Any:
    """Refuse what pydantic's ByteSize would read too leniently (a bool, "10%", -1)."""
    if isinstance(value, float) and value >= 0 and value.is_integer():
        value = int(value)
    if (isinstance(value, bool) or not isinstance(value, (int, str))
            or isinstance(value, int) and value < 0
            or isinstance(value, str) and not _MEMORY_RE.fullmatch(value)):
        raise ValueError(f"{value!r} is not a memory size; write e.g. 512MiB, 2GiB or 1G")
    return value


MemorySize = Annotated[ByteSize, BeforeValidator(_memory_shape)]
"""Bytes, from an int or a string such as "512MiB", "2GiB", "1G" or "1.5GB" (KiB, MiB,
GiB, TiB are powers of 1024; K/KB, M/MB, G/GB, T/TB powers of 1000)."""


def _is_task_count(value: Any) -> bool:
    """Whether `value` reads as a count of tasks: an int >= 0 (a whole float, digits in a string)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _role_name(name: str) -> str:
    if name not in JOBS:
        close = difflib.get_close_matches(name, JOBS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name!r} is not a role{hint}; roles are {', '.join(JOBS)}")
    return name


def parse_count_range(value: Any) -> tuple[int, int]:
    """(min, max) from "MIN..MAX" (e.g. "2..8"); ValueError naming the value and the fix."""
    match = _RANGE_RE.fullmatch(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a count or a range; write a whole number (count: 2)"
                         " or MIN..MAX with whole numbers (count: 2..8)")
    low, high = int(match.group(1)), int(match.group(2))
    if low > high:
        raise ValueError(f"the range {value!r} starts above its end ({low} > {high}); write"
                         f" MIN..MAX, e.g. {high}..{low}")
    if high < 1:
        raise ValueError(f"the range {value!r} allows no task; its maximum must be 1 or more,"
                         " e.g. 1..4")
    return low, high


def is_count_range(value: Any) -> bool:
    """Whether `value` is written as a range (a string with ".."), valid or not."""
    return isinstance(value, str) and ".." in value


RoleName = Annotated[str, AfterValidator(_role_name)]
"""A role (a job name from shoal.cluster.JOBS); the one place role names are checked."""


class RestartPolicy(str, Enum):
    """What to do when a task exits non-zero: `never` restart it, or restart `on-failure`."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


class WatchdogAction(str, Enum):
    """What the progress watchdog does when the job's step stops advancing: restart the stuck
    tasks (`restart-stuck`), stop and start every task (`restart-job`: the chief resumes from
    its checkpoint), or end the job FAILED (`fail`)."""

    RESTART_STUCK = "restart-stuck"
    RESTART_JOB = "restart-job"
    FAIL = "fail"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _host_name(value: Any) -> str:
    problem = host_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


HostName = Annotated[str, AfterValidator(_host_name)]


class HostSpec(_Frozen):
    """One host of `hosts:`: an ssh destination, and at most `slots` training tasks on it."""

    name: HostName
    slots: Optional[int] = Field(None, ge=1)


class RoleSpec(_Frozen):
    """One role (chief, worker, ps, evaluator): how many tasks and what each gets.

    `cpus` sets OMP_NUM_THREADS for local runs; `memory` is recorded and shown by
    `shoal monitor` (not enforced locally); `gpus` per task become CUDA_VISIBLE_DEVICES.
    `run` overrides the job's command for this role; `hosts` pins its tasks to some of the
    job's hosts.

    `count` is how many tasks the job starts with. Written as a range `MIN..MAX` (workers and
    ps), the job starts MIN and `shoal scale JOB worker=N` moves it within the range (`ps=N`
    only up); the range's end is `max_count` (None: the count is fixed).
    """

    count: int = Field(1, ge=0)
    max_count: Optional[int] = Field(None, ge=1)
    cpus: Optional[float] = Field(None, gt=0)
    memory: Optional[MemorySize] = None
    gpus: int = Field(0, ge=0)
    env: dict[str, str] = Field(default_factory=dict)
    run: Optional[Union[str, list[str]]] = None
    hosts: Optional[list[HostName]] = None

    @model_validator(mode="before")
    @classmethod
    def _count_range(cls, data: Any) -> Any:
        """count: MIN..MAX -> count MIN, max_count MAX (a bad range is left for `_count`)."""
        if isinstance(data, dict) and is_count_range(data.get("count")):
            try:
                low, high = parse_count_range(data["count"])
            except ValueError:
                return data
            data = {**data, "count": low, "max_count": high}
        return data

    @field_validator("count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if is_count_range(value):
            parse_count_range(value)  # raises: the range is bad
        elif not _is_task_count(value):
            raise ValueError(f"{value!r} is not a number of tasks; write a whole number such as 2"
                             " (workers and ps may take a range such as 2..8)")
        return value

    @model_validator(mode="after")
    def _range_holds_count(self) -> "RoleSpec":
        if self.max_count is not None and self.max_count < self.count:
            raise ValueError(f"max_count {self.max_count} is below count {self.count}; write the"
                             f" range as count: {self.count}..{self.max_count}"
                             f" with MIN <= MAX")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return _env_strings(value)

    @property
    def count_range(self) -> tuple[int, int]:
        """(min, max): (count, count) for a fixed count."""
        return self.count, self.max_count if self.max_count is not None else self.count


class SshSpec(_Frozen):
    """How the launcher reaches the job's hosts (`hosts:` other than localhost) with ssh.

    `config` is an ssh_config file for `ssh -F` (default: ssh's own, ~/.ssh/config);
    `python` the interpreter on the hosts (default: the launcher's, the same path);
    `connect_timeout` bounds each connection attempt; a host whose agent is silent for
    `heartbeat_timeout` counts as lost (its tasks fail, the job's restart policy applies)."""

    config: Optional[str] = None
    python: Optional[str] = None
    connect_timeout: Duration = Field(10.0, gt=0)
    heartbeat_timeout: Duration = Field(10.0, gt=0)


class RestartSpec(_Frozen):
    """Restart policy: up to `max_restarts` restarts per task, waiting `backoff` seconds
    before the first and doubling (capped at 30 s) before each next one."""

    policy: RestartPolicy = RestartPolicy.NEVER
    max_restarts: int = Field(3, ge=0)
    backoff: Duration = 1.0


DEFAULT_STALL_S = 300.0
"""The watchdog's default stall: 5 minutes (or twice the chief's checkpoint interval, if longer)."""


class WatchdogSpec(_Frozen):
    """The progress watchdog (shoal/launch/watchdog.py): when the job's global step, read from
    the tasks' progress lines, does not advance for `stall` seconds, it names the stuck tasks
    and applies `action`. `stall` None means the default (DEFAULT_STALL_S, or twice the
    chief's `--checkpoint_every_secs` if that is longer); `stall: off` (or 0), or `watchdog: off`,
    turns the watchdog off.
    `max_restarts` bounds the restarts it makes; the next stall fails the job."""

    stall: Optional[Duration] = None
    enabled: bool = True
    action: WatchdogAction = WatchdogAction.FAIL
    max_restarts: int = Field(3, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _off(cls, data: Any) -> Any:
        if data is False or data == "off":  # `watchdog: off` (YAML reads a bare off as false)
            return {"stall": None, "enabled": False}
        if isinstance(data, dict) and (data.get("stall") in ("off", False, 0, "0")):
            data = {**data, "stall": None, "enabled": False}
        return data


class JobSpec(_Frozen):
    """A whole job. `roles` maps a job name from JOBS to its RoleSpec; `deadline` and
    `grace_period` are seconds; `output_dir` None means the job's own folder.

    `run` (and a role's `run`) is the command with its parameters filled in: a list is
    argv; a string is argv shell-quoted, so `shlex.split(run)` gives exactly the argv
    (see `shoal.launch.template.render_command`). `run` is None when every role that has
    tasks, or may get some (a range), runs its own."""

    name: str
    run: Optional[Union[str, list[str]]]  # None only when every role has its own (`_run_of_roles`)
    parameters: dict[str, Union[bool, int, float, str]] = Field(default_factory=dict)
    roles: dict[RoleName, RoleSpec]
    env: dict[str, str] = Field(default_factory=dict)
    output_dir: Optional[str] = None
    workdir: Optional[str] = None
    restart: RestartSpec = Field(default_factory=RestartSpec)
    deadline: Optional[Duration] = None
    grace_period: Duration = 5.0
    hosts: list[HostSpec] = Field(default_factory=list)
    ssh: SshSpec = Field(default_factory=SshSpec)
    sync: bool = False
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    # Where the spec was read (`located`); pydantic compares these too: a spec read from a file is
    # not == the same spec made from a dict.
    _source: str = PrivateAttr(default="")
    _lines: dict[tuple, int] = PrivateAttr(default_factory=dict)

    def command_field(self, role: str) -> str:
        """The field that holds the command of `role`'s tasks: "roles.ROLE.run" or "run"."""
        own = self.roles.get(role)
        return f"roles.{role}.run" if own is not None and own.run is not None else "run"

    def located(self, field: str) -> tuple[str, Optional[int]]:
        """The file this spec was read from and the 1-based line of `field` (dotted:
        "roles.worker.run") or of its nearest enclosing field there; ("", None) for a spec of
        flags, which has no file. For errors found after the spec was read. Does not block."""
        if not self._lines:
            return "", None
        return self._source, _nearest_line(tuple(field.split(".")), self._lines)

    @model_validator(mode="before")
    @classmethod
    def _run_of_roles(cls, data: Any) -> Any:
        """A job's run: left out is None when some role has its own (`_every_role_has_a_command`
        then names any role without one), and missing (said so) when none has."""
        roles = data.get("roles") if isinstance(data, dict) else None
        if (isinstance(data, dict) and "run" not in data and isinstance(roles, dict)
                and any(isinstance(role, dict) and "run" in role for role in roles.values())):
            data = {**data, "run": None}
        return data

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> Any:
        """A host is a name, or {name, slots}."""
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("roles")
    @classmethod
    def _ranges(cls, roles: dict[str, RoleSpec]) -> dict[str, RoleSpec]:
        for job, role in roles.items():
            if role.max_count is not None and job not in SCALABLE_ROLES:
                raise ValueError(_unscalable(job, role))
            if job == "ps" and role.max_count is not None and role.count == 0:
                raise ValueError(
                    f"roles.ps.count 0..{role.max_count} starts with no ps, but a ps added later"
                    " registers with ps 0 and the tasks started first would know no ps; start the"
                    f" range at 1 (1..{role.max_count})")
        return roles

    @field_validator("run")
    @classmethod
    def _run(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip() or isinstance(value, list) and not value:
            raise ValueError("the command is empty; write e.g. run: python train.py")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return _env_strings(value)

    @field_validator("name", mode="before")
    @classmethod
    def _job_name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not re.fullmatch(_NAME_RE, value):
            raise ValueError(f"{value!r} is not a job name: use letters, digits, _ . and - (starting with a letter"
                             " or digit, at most 63 characters), e.g. mnist-sync")
        if value.isdigit():
            raise ValueError(f"{value!r} is all digits, and shoal status {value} would mean job number {value}; give"
                             f" the name a letter, e.g. job{value}")
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline_above_zero(cls, value: Optional[float]) -> Optional[float]:
        if value == 0:
            raise ValueError("a deadline of 0 would stop the job as it starts; leave deadline out for none,"
                             " or give how long the job may run, e.g. 30m")
        return value

    @model_validator(mode="after")
    def _every_role_has_a_command(self) -> "JobSpec":
        """Without a job-level run:, every role that has tasks or may get some runs its own."""
        if self.run is None:
            for job, role in self.roles.items():
                if role.run is None and (role.count or role.max_count):
                    raise ValueError(f"roles.{job}.run is missing, and so is the job's run: (the command of every "
                                     f"role without its own); add run: at the top, or one to roles.{job}")
        return self

    @model_validator(mode="after")
    def _cluster_shape(self) -> "JobSpec":
        if self.count("chief") > 1:
            raise ValueError("roles.chief.count must be 0 or 1: a cluster has one chief")
        worker = self.role("worker")
        if self.count("chief") == 0 and worker.count == 0 and worker.max_count is not None:
            raise ValueError(
                f"roles.worker.count {worker.count}..{worker.max_count} starts with no worker and the"
                " job has no chief, so it would start with no task; start the range at 1"
                f" (1..{worker.max_count}), or add a chief (roles: {{chief: {{}}}}, shoal run --chief)"
            )
        if self.count("chief") + self.count("worker") == 0:
            raise ValueError(
                "the job has no chief and no worker; add e.g. roles: {worker: {count: 1}}"
            )
        return self

    def host_list(self) -> tuple[Host, ...]:
        """The job's hosts (empty: this machine)."""
        return tuple(Host(h.name, h.slots) for h in self.hosts)

    def uses_gpus(self) -> bool:
        """Whether some role asks for GPUs (one that starts with no task too)."""
        return any(role.gpus for role in self.roles.values())

    def pinned_hosts(self) -> dict[str, list[str]]:
        """Role -> the hosts its tasks are pinned to, for the roles that pin any."""
        return {job: list(role.hosts) for job, role in self.roles.items() if role.hosts}

    def role(self, job: str) -> RoleSpec:
        """The RoleSpec of `job`, or a zero-count one if the spec has none."""
        return self.roles.get(job, RoleSpec(count=0))

    def count(self, job: str) -> int:
        """How many tasks `job` starts with (0 if absent; a range's minimum)."""
        return self.role(job).count

    def scale_ranges(self) -> tuple[tuple[str, int, int], ...]:
        """(role, min, max) of each role whose count is a range."""
        return tuple((job, *role.count_range) for job, role in self.roles.items()
                     if role.max_count is not None)


def _unscalable(job: str, role: RoleSpec) -> str:
    written = f"{role.count}..{role.max_count}"
    if job == "chief":
        return (f"roles.chief.count is a range ({written}) but a cluster has one chief; write"
                " count: 1 (only roles.worker.count and roles.ps.count may be a range MIN..MAX)")
    return (f"roles.{job}.count is a range ({written}) but only workers scale (and ps, up"
            " only); write a plain count, e.g. count: 1")


def load_spec(path: Union[str, Path], overrides: tuple[str, ...] = (),
              source: Optional[str] = None) -> JobSpec:
    """Read, template and validate the YAML spec at `path`; SpecError on any problem.

    `overrides` are "name=value" strings that replace declared parameters; `source`
    names the file in errors (default: `path`). Blocks on reading the file; thread-safe.
    """
    source = source or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read the job spec: {e.strerror}; check the path",
                        source=source) from e
    try:
        _check_shape(text, source)
        _refuse_duplicate_keys(text, source)
        data = yaml.safe_load(text)
        lines = _key_lines(yaml.compose(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(
            f"invalid YAML: {problem}; a value starting with {{{{ must be quoted, e.g."
            ' count: "{{ workers }}"' if _unquoted_template_at(text, e) else f"invalid YAML: {problem}",
            source=source, line=mark.line + 1 if mark else None,
        ) from e
    return spec_from_dict(data, source=source, lines=lines, overrides=overrides)


_UNQUOTED_TEMPLATE_RE = re.compile(r"(?:^|:|^\s*-)\s*\{\{")


def _unquoted_template_at(text: str, error: yaml.YAMLError) -> bool:
    """Whether a line `error` points at holds a value that starts with an unquoted `{{`
    (which YAML reads as a mapping), the usual cause of a templated spec that does not parse."""
    lines = text.splitlines()
    marks = (getattr(error, "problem_mark", None), getattr(error, "context_mark", None))
    return any(m is not None and m.line < len(lines) and _UNQUOTED_TEMPLATE_RE.search(lines[m.line])
               for m in marks)


def spec_from_dict(data: Any, *, source: str = "flags", lines: Optional[dict] = None,
                   overrides: tuple[str, ...] = ()) -> JobSpec:
    """Template and validate an already-loaded spec mapping (from YAML or from flags)."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise SpecError(
            "the job spec must be a mapping with at least name:, run: (or one per role) and roles:",
            source=source, line=1,
        )
    _refuse_unknown_top_level(data, source, lines)  # before templating: a typo in parameters: says so
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise SpecError("parameters must be a mapping of name: value", source=source,
                        line=lines.get(("parameters",)), field="parameters")
    for name, value in params.items():
        if not isinstance(name, str) or not _PARAMETER_RE.fullmatch(name):
            raise SpecError(
                f"{name!r} is not a parameter name; use letters, digits and _ (and quote"
                " YAML words such as on, off, yes, no)",
                source=source, line=_nearest_line(("parameters", name), lines),
                field=f"parameters.{name}",
            )
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError(
                f"parameter {name!r} must be a string, a number or true/false, not {value!r}",
                source=source, line=lines.get(("parameters", name)), field=f"parameters.{name}",
            )
    params = parse_overrides(overrides, params)
    rendered = {
        key: value if key == "parameters" else
        render_tree(value, params, (key,), lines, source, is_command=_is_command)
        for key, value in data.items()
    }
    rendered["parameters"] = params
    try:
        spec = JobSpec.model_validate(rendered)
    except ValidationError as e:
        error = _spec_error(e, source, lines)
        if not overrides:
            raise error from e
        given = " ".join(f"-p {item}" for item in overrides)  # a value of the spec may come from them
        raise SpecError(f"{error.detail} (parameters given: {given})", source=error.source, line=error.line,
                        field=error.field) from e
    spec._source, spec._lines = source, lines  # for errors found later (`located`)
    return spec


def _fields_at(parent: tuple) -> list[str]:
    """The field names a spec mapping at `parent` may hold (its YAML keys), [] if unknown."""
    models: dict[tuple, type[BaseModel]] = {(): JobSpec, ("ssh",): SshSpec, ("restart",): RestartSpec,
                                            ("watchdog",): WatchdogSpec}
    model = models.get(parent) or (RoleSpec if parent[:1] == ("roles",) and len(parent) == 2 else
                                   HostSpec if parent[:1] == ("hosts",) and len(parent) == 2 else None)
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


def _unknown_field(loc: tuple) -> str:
    close = difflib.get_close_matches(str(loc[-1]), _fields_at(loc[:-1]), n=1) if loc else []
    if close:
        return f"is not a known field (did you mean {close[0]!r}?)"
    return "is not a known field; check its spelling (see docs/launcher.md)"


def _refuse_unknown_top_level(data: dict, source: str, lines: dict) -> None:
    """SpecError for top-level keys the spec does not have, with the nearest known one."""
    unknown = [key for key in data if key not in _fields_at(())]
    if not unknown:
        return
    where = [(source + (f":{lines[(k,)]}" if (k,) in lines else ""), k) for k in unknown]
    msg = _unknown_field((unknown[0],)) + "".join(f"\n  also {w}: {k}: {_unknown_field((k,))}" for w, k in where[1:])
    raise SpecError(msg, source=source, line=lines.get((unknown[0],)), field=str(unknown[0]))


def _spec_error(error: ValidationError, source: str, lines: dict) -> SpecError:
    messages = []
    first: Optional[tuple[Optional[int], str, str]] = None
    # a misspelt field first: the "missing" error of the field it meant follows from it
    for item in sorted(error.errors(), key=lambda item: item["type"] != "extra_forbidden"):
        loc = tuple(part for part in item["loc"] if not _is_union_tag(part))
        loc, msg = _named_field(loc, item["msg"].removeprefix("Value error, "))
        line = _nearest_line(loc, lines)
        if item["type"] == "missing":
            msg = "is missing; add it" + (" (or give every role its own run:)" if loc == ("run",) else "")
        elif item["type"] == "extra_forbidden":
            msg = _unknown_field(loc)
        else:
            named_value = "input" in item and (repr(item["input"]) in msg  # pydantic's message may name the value
                                               or item["input"] is None and "null" in msg)  # (as YAML writes it)
            if item["type"] in ("greater_than", "greater_than_equal"):  # "greater than 0" names the bound, not it
                named_value = bool(loc) and loc[-1] in _DURATION_FIELDS  # a duration's input is its seconds: not said
            msg = _with_an_example(item, loc, msg)
            if ("input" in item and item["loc"][-1:] != ("[key]",) and not isinstance(item["input"], dict)
                    and not named_value):
                msg += f" (got {item['input']!r})"
        field = dotted(loc) or "(top level)"
        if first is None:
            first = (line, field, msg)
        where = source + (f":{line}" if line else "")
        if f"{where}: {field}: {msg}" not in messages:  # one per field and message: a union's parts say one thing
            messages.append(f"{where}: {field}: {msg}")
    assert first is not None
    line, field, msg = first
    if len(messages) > 1:
        msg += "".join(f"\n  also {m}" for m in messages[1:])
    return SpecError(msg, source=source, line=line, field=field)


_MAPPING_EXAMPLES = {  # a field that must be a mapping, by its name: how one is written
    "restart": "restart: {policy: on-failure, max_restarts: 3}",
    "watchdog": "watchdog: {stall: 5m, action: restart-stuck}",
    "ssh": "ssh: {config: ~/.ssh/config, connect_timeout: 10s}",
    "env": "env: {NAME: value}",
    "roles": "roles: {ps: {count: 1}, worker: {count: 2}}",
    "parameters": "parameters: {steps: 1000}",
}


def _duration_fields(*models: type[BaseModel]) -> frozenset[str]:
    """The names of the fields of `models` that hold a Duration (or an optional one)."""
    return frozenset(name for model in models for name, field in model.model_fields.items()
                     if _AS_DURATION in field.metadata or Duration in get_args(field.annotation))


_DURATION_FIELDS = _duration_fields(JobSpec, RoleSpec, SshSpec, RestartSpec, WatchdogSpec)
"""Fields whose example in an error is a duration ("10s"), not a number."""


def _with_an_example(item: Mapping[str, Any], loc: tuple, msg: str) -> str:
    """pydantic's message for a value of the wrong shape (`item`, one of its errors, at the
    spec's field `loc`), said in the spec's own terms with an example of the right one; other
    messages, and errors in a mapping's keys, as they are."""
    kind, name = item["type"], loc[-1] if loc else ""
    if item["loc"][-1:] == ("[key]",):
        if loc[:1] == ("roles",) and kind == "string_type":  # YAML read the key as a number or true/false
            return f"a role is named, not numbered; roles are {', '.join(JOBS)}"
        return msg
    if any(part in ("str", "list[str]") for part in item["loc"]) and kind in ("string_type", "list_type"):
        return "must be a command: text, or a list of words"  # run: (a union of the two)
    if loc[:1] == ("hosts",) and len(loc) == 2:
        return "must be a host name or a mapping; write e.g. hosts: [node1, {name: node2, slots: 4}]"
    if kind in ("model_type", "dict_type"):
        example = _MAPPING_EXAMPLES.get(str(name)) or (
            f"{name}: {{count: 2}}" if loc[:1] == ("roles",) and len(loc) == 2 else "")
        return "must be a mapping" + (f"; write e.g. {example}" if example else "")
    if kind == "string_type":
        return f'must be text; quote it: {name}: "..."' if isinstance(name, str) else 'must be text; quote it: "..."'
    if kind in ("byte_size_unit", "byte_size"):
        return "is not a size; write e.g. 512MiB, 2GiB or 1.5GB"
    if kind == "greater_than" and isinstance(name, str):
        example = "10s" if name in _DURATION_FIELDS else "2"
        return f"must be more than {item['ctx']['gt']:g}; give e.g. {name}: {example}"
    return msg


def _named_field(loc: tuple, msg: str) -> tuple[tuple, str]:
    """A check over several fields names the one at fault first ("roles.chief.count must be
    0 or 1"): that field's path (so the error points at its line), and the message after it."""
    first, _, rest = msg.partition(" ")
    path = tuple(first.split("."))
    if (rest and len(path) > max(1, len(loc)) and path[:len(loc)] == loc and path[0] in _fields_at(())
            and all(part.isidentifier() for part in path)):
        return path, rest
    return loc, msg


def _is_command(path: tuple) -> bool:
    """Whether the field at `path` is a command: `run`, or `roles.<role>.run`."""
    return path == ("run",) or len(path) == 3 and path[0] == "roles" and path[2] == "run"


def _check_shape(text: str, source: str) -> None:
    """Refuse YAML that would be costly to load: nesting deeper than MAX_DEPTH, aliases
    that add more than MAX_ALIAS_NODES nodes (an "alias bomb" of 1 KB can stand for 10**9),
    an alias inside the node it names. Streams the parser's events, so it neither recurses
    nor expands anything; YAMLError for YAML that does not parse."""
    sizes: dict[str, Optional[int]] = {}  # anchor -> nodes it stands for (None: still open)
    open_nodes: list[list] = [[0, None]]  # [nodes so far, anchor] per open collection
    added = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_nodes) > MAX_DEPTH:
                raise SpecError(
                    f"the spec is nested more than {MAX_DEPTH} deep; a job spec needs a few"
                    " levels (roles: worker: env:), flatten it", source=source, line=line)
            open_nodes.append([1, event.anchor])
            if event.anchor:
                sizes[event.anchor] = None
        elif isinstance(event, yaml.CollectionEndEvent):
            size, anchor = open_nodes.pop()
            if anchor:
                sizes[anchor] = size
            open_nodes[-1][0] += size
        elif isinstance(event, yaml.ScalarEvent):
            open_nodes[-1][0] += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in sizes and sizes[event.anchor] is None:
                raise SpecError(
                    f"alias *{event.anchor} is inside the node &{event.anchor} it names, so"
                    " it never ends; write the value out", source=source, line=line)
            size = sizes.get(event.anchor) or 1  # an undefined one: the composer says so
            added += size
            if added > MAX_ALIAS_NODES:
                raise SpecError(
                    f"YAML aliases (*{event.anchor} here) expand the spec by more than"
                    f" {MAX_ALIAS_NODES} nodes; a job spec needs no more, write the values"
                    " out or use fewer aliases", source=source, line=line)
            open_nodes[-1][0] += size


def _refuse_duplicate_keys(text: str, source: str) -> None:
    """SpecError for a key written twice in one mapping (YAML would keep the last one silently,
    dropping e.g. a whole first `roles:`). Streams the parser's events."""
    frames: list[Optional[list]] = []  # per open collection: [a key comes next, {key: line}]; None: a list
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionEndEvent):
            frames.pop()
            continue
        if not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
            continue
        frame = frames[-1] if frames else None
        if frame is not None:
            if frame[0] and isinstance(event, yaml.ScalarEvent):
                line = event.start_mark.line + 1
                if event.value in frame[1]:
                    raise SpecError(f"{event.value!r} is written twice in the same mapping (first at line"
                                    f" {frame[1][event.value]}); YAML would keep only this one: merge them",
                                    source=source, line=line)
                frame[1][event.value] = line
            frame[0] = not frame[0]
        if isinstance(event, yaml.MappingStartEvent):
            frames.append([True, {}])
        elif isinstance(event, yaml.SequenceStartEvent):
            frames.append(None)


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "list[str]", "int", "float", "bool",
                                               "[key]")
                                      or part.startswith(("function-", "constrained-")))


def _nearest_line(loc: tuple, lines: dict) -> Optional[int]:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get((), None)


def _key_lines(node: Optional[yaml.Node], path: tuple = ()) -> dict[tuple, int]:
    """Map each field path to the 1-based line where its key (or list item) is written."""
    out: dict[tuple, int] = {}
    if node is None:
        return out
    if not path:
        out[()] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = path + (key_node.value,)
            out[sub] = key_node.start_mark.line + 1
            out.update(_key_lines(value_node, sub))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            sub = path + (index,)
            out[sub] = item.start_mark.line + 1
            out.update(_key_lines(item, sub))
    return out


LAUNCHER_VARIABLES = {
    "TF_CONFIG": "each task's identity in the cluster",
    "SHOAL_TASK": "each task's identity",
    "RANK": "each replica's rank", "WORLD_SIZE": "the number of replicas",
    "MASTER_ADDR": "the job's rendezvous address", "MASTER_PORT": "the job's rendezvous port",
    "SHOAL_JOB_ID": "the job's id", "SHOAL_JOB_NAME": "the job's name (name:)",
    "SHOAL_JOB_SECRET": "a fresh secret per job, never written to a file",
    "OUTPUT_DIR": "the model dir (output_dir:)",
}
"""Variables plan.py sets for every task (its identity, the job's wiring): an `env:` may not set
them, since a task given another value would not find, or not be let into, the job."""


def _env_strings(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    reserved = [str(key) for key in value if str(key) in LAUNCHER_VARIABLES]
    if reserved:
        key = reserved[0]
        raise ValueError(f"{key} is set by the launcher for every task ({LAUNCHER_VARIABLES[key]}); remove it from"
                         " env:" + (" and set output_dir: instead" if key == "OUTPUT_DIR" else
                                    " and set name: instead" if key == "SHOAL_JOB_NAME" else ""))
    out = {}
    for key, item in value.items():
        if isinstance(item, (dict, list)) or item is None:
            raise ValueError(f"env {key!r} must be a string or number, not {item!r}")
        out[str(key)] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return out
