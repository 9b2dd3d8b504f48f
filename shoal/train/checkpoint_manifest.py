"""The shape of a checkpoint's manifest.json, checked strictly with pydantic, and the values a
right shape can still get wrong: the step must be the one the checkpoint's directory is named
for, and the lease book must be one ps 0 accepts (by ps 0's own rules, `LeaseBook.restore`).
Any mismatch means the checkpoint is damaged: the loader skips it and moves it aside, where a
bad lease book would otherwise be refused by ps 0 at every start. Its own module so that only a
task that reads or writes checkpoints (the chief) imports pydantic; a worker's start stays
fast. Pure validation (besides reading the file); thread-safe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.ps.leases import LeaseBook, LeaseError
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
    leases: dict[str, Any] | None = None  # the lease book: _check_values checks it by ps 0's rules


def read_manifest(path: Path) -> tuple[dict[str, Any], "Manifest"]:
    """The manifest of the checkpoint at `path`, raw and validated (its shape, its step against
    the directory's name, its lease book); CheckpointError naming what is wrong. Blocks (reads
    the file)."""
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
        manifest = Manifest.model_validate(raw, strict=True)
    except ValidationError as e:
        raise CheckpointError(f"{file} does not have the shape of a {FORMAT} manifest: {describe(e)}") from e
    _check_values(path, manifest)
    return raw, manifest


def _check_values(path: Path, manifest: Manifest) -> None:
    """What the shape does not tell: the step and the lease book. Raises CheckpointError."""
    named = f"ckpt-{manifest.step:010d}"
    if path.name != named:
        raise CheckpointError(f"{_MANIFEST_FILE} says step {manifest.step}, but the checkpoint's directory is "
                              f"{path.name}, not {named}")
    if manifest.leases is not None:
        try:
            LeaseBook.restore("checkpoint", manifest.leases)  # what ps 0 does with it at init
        except LeaseError as e:
            raise CheckpointError(f"ps 0 would refuse its lease book ({_MANIFEST_FILE} 'leases'): {e}") from e


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
