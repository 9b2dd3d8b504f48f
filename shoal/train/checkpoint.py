"""Checkpoint files: safetensors tensors plus a JSON manifest, written atomically, last K kept.

A checkpoint is a directory `<model_dir>/checkpoints/ckpt-<step, 10 digits>/` holding

    variables.safetensors   every variable, whole (not sharded), by the model's own names
    optimizer.safetensors   the update rule's slots, key "<variable>@<slot>" (Adam's m, v, t, ...)
    manifest.json           format, step, optimizer config, training mode, each variable's dtype,
                            shape and shard layout at save time, and the sha256 of both files

Variables are stored whole, so a checkpoint restores into any number of ps tasks. The
directory is written under a temporary name, every file and the directory are fsync'ed, and
then it is renamed into place: a reader sees a whole checkpoint or none. A checkpoint whose
files do not match the manifest's checksums (a disk error, a copy cut short) is skipped with a
warning and the previous one is used.

Nothing here is thread-safe; every call blocks on the filesystem.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load, save_file

from shoal.ps.protocol import SLOT_SEPARATOR
from shoal.train.errors import TrainError

log = logging.getLogger(__name__)

FORMAT = "shoal-checkpoint"
VERSION = 1
_DIR_PATTERN = re.compile(r"^ckpt-(\d{10})$")
_VARIABLES_FILE = "variables.safetensors"
_OPTIMIZER_FILE = "optimizer.safetensors"
_MANIFEST_FILE = "manifest.json"

Slots = dict[str, dict[str, np.ndarray]]


class CheckpointError(TrainError):
    """A checkpoint could not be written, or does not fit the model being restored."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint read back from disk (checksums verified)."""

    path: Path
    step: int
    variables: dict[str, np.ndarray]
    slots: Slots
    optimizer: dict[str, Any]
    manifest: dict[str, Any]


def checkpoint_root(model_dir: str | os.PathLike) -> Path:
    return Path(model_dir) / "checkpoints"


def save_checkpoint(model_dir: str | os.PathLike, step: int, variables: Mapping[str, np.ndarray], slots: Slots,
                    *, optimizer: Mapping[str, Any], mode: str, layout: Mapping[str, list[dict]] | None = None,
                    keep: int = 5) -> Path:
    """Write a checkpoint of `step` atomically, then delete all but the newest `keep`. Blocks."""
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least one checkpoint must be kept")
    root = checkpoint_root(model_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {root}: {e}; check --model_dir") from e
    final = root / f"ckpt-{step:010d}"
    tmp = root / f".tmp-ckpt-{step:010d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        flat_slots = {f"{name}{SLOT_SEPARATOR}{slot}": value
                      for name, per_slot in slots.items() for slot, value in per_slot.items()}
        files = {_VARIABLES_FILE: _write_tensors(tmp / _VARIABLES_FILE, variables),
                 _OPTIMIZER_FILE: _write_tensors(tmp / _OPTIMIZER_FILE, flat_slots)}
        manifest = {
            "format": FORMAT, "version": VERSION, "step": int(step), "created_unix": time.time(),
            "optimizer": dict(optimizer), "mode": mode,
            "variables": {name: {"dtype": str(v.dtype), "shape": list(v.shape),
                                 "shards": list((layout or {}).get(name, []))} for name, v in variables.items()},
            "slots": {name: sorted(per_slot) for name, per_slot in slots.items()},
            "files": files,
        }
        _write_durably(tmp / _MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
        _fsync_dir(tmp)
        replaced = None
        if final.exists():  # the same step saved again (at the end, right after a periodic save)
            replaced = root / f".old-{final.name}-{os.getpid()}"
            os.rename(final, replaced)
        os.rename(tmp, final)
        _fsync_dir(root)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep)
    return final


def load_latest_checkpoint(model_dir: str | os.PathLike) -> Checkpoint | None:
    """The newest checkpoint whose files match their checksums, or None if there is none.

    Damaged checkpoints are skipped with a warning that names them. Blocks.
    """
    for path in reversed(list_checkpoints(model_dir)):
        try:
            return read_checkpoint(path)
        except CheckpointError as e:
            log.warning("skipping damaged checkpoint %s: %s; trying the previous one", path, e)
    return None


def list_checkpoints(model_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint directories, oldest first (temporary ones from a crashed save are ignored)."""
    root = checkpoint_root(model_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR_PATTERN.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify one checkpoint directory. Raises CheckpointError if it is damaged."""
    path = Path(path)
    try:
        manifest = json.loads((path / _MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"its manifest is missing or unreadable ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path / _MANIFEST_FILE} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"format version {manifest.get('version')!r} is not {VERSION}; "
                              "was it written by a newer Shoal?")
    tensors = {}
    for name in (_VARIABLES_FILE, _OPTIMIZER_FILE):
        expected = manifest.get("files", {}).get(name, {}).get("sha256")
        try:
            data = (path / name).read_bytes()
        except OSError as e:
            raise CheckpointError(f"{name} is missing ({e})") from e
        if hashlib.sha256(data).hexdigest() != expected:
            raise CheckpointError(f"{name} does not match its sha256 in the manifest (corrupt or cut short)")
        tensors[name] = load(data)
    slots: Slots = {}
    for key, value in tensors[_OPTIMIZER_FILE].items():
        name, _, slot = key.rpartition(SLOT_SEPARATOR)
        slots.setdefault(name, {})[slot] = value
    return Checkpoint(path, int(manifest["step"]), tensors[_VARIABLES_FILE], slots,
                      dict(manifest.get("optimizer") or {}), manifest)


def export_model(path: str | os.PathLike, variables: Mapping[str, np.ndarray], *, step: int) -> Path:
    """Write the final model as one safetensors file (loads without Shoal, e.g. with
    `safetensors.torch.load_file` into a module's `load_state_dict`). Atomic. Blocks."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        _write_tensors(tmp, variables, metadata={"format": "shoal-export", "step": str(step)})
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_tensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: dict[str, str] | None = None) -> dict:
    arrays = {name: np.require(value, requirements="C") for name, value in tensors.items()}
    save_file(arrays, str(path), metadata=metadata)
    digest = hashlib.sha256()
    with open(path, "rb+") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
        os.fsync(f.fileno())
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path, keep: int) -> None:
    for old in list_checkpoints(root.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in [*root.glob(".tmp-ckpt-*"), *root.glob(".old-ckpt-*")]:
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
