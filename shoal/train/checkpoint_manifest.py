"""The shape of a checkpoint's manifest.json, checked strictly with pydantic: any mismatch means
the checkpoint is damaged. Its own module so that only a task that reads or writes checkpoints
(the chief) imports pydantic; a worker's start stays fast. Pure validation; thread-safe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.train.checkpoint import _MANIFEST_FILE, _OPTIMIZER_FILE, _VARIABLES_FILE, FORMAT, VERSION, CheckpointError


_Count = Annotated[int, Field(ge=0)]


class _FileEntry(BaseModel):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: _Count


class _Files(BaseModel):
    variables: _FileEntry = Field(alias=_VARIABLES_FILE)
    optimizer: _FileEntry = Field(alias=_OPTIMIZER_FILE)


class _Shard(BaseModel):
    name: str
    ps: _Count
    start: _Count
    stop: _Count


class _Variable(BaseModel):
    dtype: str
    shape: list[_Count]
    shards: list[_Shard]


class Manifest(BaseModel):
    """The shape of manifest.json. Validated strictly: any mismatch means the checkpoint is damaged."""

    model_config = ConfigDict(frozen=True)

    format: Literal["shoal-checkpoint"]
    version: Literal[1]
    step: _Count
    created_unix: float
    optimizer: dict[str, Any]
    mode: str
    variables: dict[str, _Variable]
    slots: dict[str, list[str]]
    files: _Files
    leases: dict[str, Any] | None = None  # the lease book (shoal/ps/leases.py checks it when restored)


def read_manifest(path: Path) -> tuple[dict[str, Any], "Manifest"]:
    """The manifest of the checkpoint at `path`, raw and validated; CheckpointError naming what is wrong."""
    file = path / _MANIFEST_FILE
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"its manifest is missing or unreadable ({e})") from e
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a {FORMAT} manifest")
    if raw.get("version") != VERSION:
        raise CheckpointError(f"format version {raw.get('version')!r} is not {VERSION}; "
                              "was it written by a newer Shoal?")
    try:
        return raw, Manifest.model_validate(raw, strict=True)
    except ValidationError as e:
        raise CheckpointError(f"{file} does not have the shape of a {FORMAT} manifest: {describe(e)}") from e


def describe(e: ValidationError) -> str:
    problems = [f"{'.'.join(str(part) for part in err['loc']) or 'the whole'}: {err['msg']}" for err in e.errors()]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def validate_new(manifest: dict[str, Any], step: int) -> None:
    """Check a manifest about to be written (its `files` not known yet), so that a checkpoint is
    never written that could not be read back."""
    placeholder = {"sha256": "0" * 64, "bytes": 0}
    try:
        Manifest.model_validate({**manifest, "files": {_VARIABLES_FILE: placeholder, _OPTIMIZER_FILE: placeholder}},
                                strict=True)
    except ValidationError as e:
        raise CheckpointError(f"cannot save checkpoint step={step}: {describe(e)}; pass a non-negative int step, "
                              "a str mode and a layout of {name, ps, start, stop} per shard") from e
