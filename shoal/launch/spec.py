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
"""

from __future__ import annotations

import difflib
import re
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shoal.cluster import JOBS
from shoal.launch.errors import SpecError
from shoal.launch.template import dotted, parse_overrides, render_tree

_DURATION_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_MEMORY_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like "500ms", "30s", "10m", "1h"."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 10m or 1h")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_RE.fullmatch(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30s, 10m or 1h")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"duration {value!r} is negative")
    return seconds


def parse_memory(value: Any) -> int:
    """Bytes from a number or a string like "512MiB", "2GiB", "1G"."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size; write e.g. 512MiB or 2GiB")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"memory {value!r} is negative")
        return int(value)
    match = _MEMORY_RE.fullmatch(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a memory size; write e.g. 512MiB or 2GiB")
    unit = (match.group(2) or "").upper().rstrip("B") or ""
    return int(float(match.group(1)) * _MEMORY_UNITS[unit or ""])


class RestartPolicy(str, Enum):
    """What to do when a task exits non-zero: `never` restart it, or restart `on-failure`."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RoleSpec(_Frozen):
    """One role (chief, worker, ps, evaluator): how many tasks and what each gets.

    `cpus` sets OMP_NUM_THREADS for local runs; `memory` is recorded and shown by
    `shoal monitor` (not enforced locally); `gpus` per task become CUDA_VISIBLE_DEVICES.
    `run` overrides the job's command for this role.
    """

    count: int = Field(1, ge=0)
    cpus: Optional[float] = Field(None, gt=0)
    memory: Optional[int] = None
    gpus: int = Field(0, ge=0)
    env: dict[str, str] = Field(default_factory=dict)
    run: Optional[Union[str, list[str]]] = None

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Optional[int]:
        return None if value is None else parse_memory(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return _env_strings(value)


class RestartSpec(_Frozen):
    """Restart policy: up to `max_restarts` restarts per task, waiting `backoff` seconds
    before the first and doubling (capped at 30 s) before each next one."""

    policy: RestartPolicy = RestartPolicy.NEVER
    max_restarts: int = Field(3, ge=0)
    backoff: float = 1.0

    @field_validator("backoff", mode="before")
    @classmethod
    def _backoff(cls, value: Any) -> float:
        return parse_duration(value)


class JobSpec(_Frozen):
    """A whole job. `roles` maps a job name from JOBS to its RoleSpec; `deadline` and
    `grace_period` are seconds; `output_dir` None means the job's own folder."""

    name: str = Field(pattern=f"^{_NAME_RE}$")
    run: Union[str, list[str]]
    parameters: dict[str, Union[bool, int, float, str]] = Field(default_factory=dict)
    roles: dict[str, RoleSpec]
    env: dict[str, str] = Field(default_factory=dict)
    output_dir: Optional[str] = None
    workdir: Optional[str] = None
    restart: RestartSpec = Field(default_factory=RestartSpec)
    deadline: Optional[float] = None
    grace_period: float = 5.0

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

    @field_validator("deadline", "grace_period", mode="before")
    @classmethod
    def _durations(cls, value: Any) -> Optional[float]:
        return None if value is None else parse_duration(value)

    @field_validator("roles", mode="before")
    @classmethod
    def _role_names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name in value:
                if name not in JOBS:
                    close = difflib.get_close_matches(str(name), JOBS, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(
                        f"{name!r} is not a role{hint}; roles are {', '.join(JOBS)}"
                    )
        return value

    @model_validator(mode="after")
    def _cluster_shape(self) -> "JobSpec":
        if self.count("chief") > 1:
            raise ValueError("roles.chief.count must be 0 or 1: a cluster has one chief")
        if self.count("chief") + self.count("worker") == 0:
            raise ValueError(
                "the job has no chief and no worker; add e.g. roles: {worker: {count: 1}}"
            )
        return self

    def role(self, job: str) -> RoleSpec:
        """The RoleSpec of `job`, or a zero-count one if the spec has none."""
        return self.roles.get(job, RoleSpec(count=0))

    def count(self, job: str) -> int:
        """How many tasks `job` has (0 if absent)."""
        return self.role(job).count


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
        data = yaml.safe_load(text)
        lines = _key_lines(yaml.compose(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(
            f"invalid YAML: {problem}; a value starting with {{{{ must be quoted, e.g."
            ' count: "{{ workers }}"' if "{{" in text else f"invalid YAML: {problem}",
            source=source, line=mark.line + 1 if mark else None,
        ) from e
    return spec_from_dict(data, source=source, lines=lines, overrides=overrides)


def spec_from_dict(data: Any, *, source: str = "flags", lines: Optional[dict] = None,
                   overrides: tuple[str, ...] = ()) -> JobSpec:
    """Template and validate an already-loaded spec mapping (from YAML or from flags)."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise SpecError(
            "the job spec must be a mapping with at least name:, run: and roles:",
            source=source, line=1,
        )
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise SpecError("parameters must be a mapping of name: value", source=source,
                        line=lines.get(("parameters",)), field="parameters")
    params = parse_overrides(overrides, params)
    _check_role_names(data.get("roles"), source, lines)
    rendered = {
        key: value if key == "parameters" else render_tree(value, params, (key,), lines, source)
        for key, value in data.items()
    }
    rendered["parameters"] = params
    try:
        return JobSpec.model_validate(rendered)
    except ValidationError as e:
        raise _spec_error(e, source, lines) from e


def _spec_error(error: ValidationError, source: str, lines: dict) -> SpecError:
    messages = []
    first: Optional[tuple[Optional[int], str, str]] = None
    for item in error.errors():
        loc = tuple(part for part in item["loc"] if not _is_union_tag(part))
        line = _nearest_line(loc, lines)
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            msg = "is missing; add it"
        elif item["type"] == "extra_forbidden":
            msg = "is not a known field; check its spelling (see docs/launcher.md)"
        elif "input" in item:
            msg += f" (got {item['input']!r})"
        field = dotted(loc) or "(top level)"
        if first is None:
            first = (line, field, msg)
        where = source + (f":{line}" if line else "")
        messages.append(f"{where}: {field}: {msg}")
    assert first is not None
    line, field, msg = first
    if len(messages) > 1:
        msg += "".join(f"\n  also {m}" for m in messages[1:])
    return SpecError(msg, source=source, line=line, field=field)


def _check_role_names(roles: Any, source: str, lines: dict) -> None:
    if not isinstance(roles, dict):
        return
    for name in roles:
        if name not in JOBS:
            close = difflib.get_close_matches(str(name), JOBS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(
                f"{name!r} is not a role{hint}; roles are {', '.join(JOBS)}",
                source=source, line=lines.get(("roles", name)), field=f"roles.{name}",
            )


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "list[str]", "int", "float", "bool")
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


def _env_strings(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if isinstance(item, (dict, list)) or item is None:
            raise ValueError(f"env {key!r} must be a string or number, not {item!r}")
        out[str(key)] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return out
