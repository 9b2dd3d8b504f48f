"""Checkpoint files: safetensors tensors plus a JSON manifest, written atomically, last K good kept.

A checkpoint is a directory `<model_dir>/checkpoints/ckpt-<step, 10 digits>/` holding

    variables.safetensors   every variable, whole (not sharded), by the model's own names
    optimizer.safetensors   the update rule's slots, key "<variable>@<slot>" (Adam's m, v, t, ...)
    manifest.json           format, step, optimizer config, training mode, each variable's dtype,
                            shape and shard layout at save time, the sha256 of both files, and
                            (when the job leases its data) the lease book: the epoch and the
                            positions consumed (docs/dynamic-sharding.md)

Variables are stored whole, so a checkpoint restores into any number of ps tasks. The
directory is written under a temporary name unique to the save, every file and the directory
are fsync'ed, and then it is renamed into place: a reader sees a whole checkpoint or none.

A checkpoint is damaged when its manifest does not have the manifest's shape, names a step
other than its directory's or holds a lease book ps 0 would refuse (checkpoint_manifest.py), or
its files do not match it (a disk error, a copy cut short, a hand edit). A damaged checkpoint
found by the loader or by pruning is moved aside to `damaged-ckpt-<step>` (kept for inspection,
never read or pruned again) with a warning, so that it never shadows a good one; pruning keeps
the checkpoint just written and the newest ones that verify. This process remembers which
checkpoints it wrote or verified (and the size, times and inode of their files then), so a save
re-hashes none of them; a checkpoint another process wrote is hashed once.

Every save holds `checkpoints/.writers.lock` shared while its temporary directory exists;
temporary directories are removed only under the lock held exclusively, i.e. when no save is
under way, so cleanup never touches another writer's. Two jobs must still not share a model
dir: see `shoal.train.model_dir_lock`.

Nothing here is thread-safe unless it says so; every call blocks on the filesystem.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save_file

from shoal.ps.protocol import SLOT_SEPARATOR
from shoal.train.errors import TrainError

log = logging.getLogger(__name__)

FORMAT = "shoal-checkpoint"
VERSION = 1
_DIR_PATTERN = re.compile(r"^ckpt-(\d{10})$")
_STALE_PATTERN = re.compile(r"^\.(tmp|old)-(ckpt-\d{10})-")
_DAMAGED_PREFIX = "damaged-"
_WRITERS_LOCK = ".writers.lock"
_VARIABLES_FILE = "variables.safetensors"
_OPTIMIZER_FILE = "optimizer.safetensors"
_MANIFEST_FILE = "manifest.json"
_FILES = (_VARIABLES_FILE, _OPTIMIZER_FILE, _MANIFEST_FILE)

Slots = dict[str, dict[str, np.ndarray]]


class CheckpointError(TrainError):
    """A checkpoint could not be written, is damaged, or does not fit the model being restored."""


class CheckpointWriteError(CheckpointError, OSError):
    """The filesystem refused a checkpoint write (disk full, model dir gone or read-only).

    Also an OSError, as these failures were before they were named.
    """


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint read back from disk (checksums verified)."""

    path: Path
    step: int
    variables: dict[str, np.ndarray]
    slots: Slots
    optimizer: dict[str, Any]
    manifest: dict[str, Any]
    leases: dict[str, Any] | None = None  # the lease book's state (dynamic data sharding), if the job had one


class _VerifiedCheckpoints:
    """Checkpoints this process wrote or verified, each with the stat of its files at the time.

    A checkpoint whose files still have that size, inode and times need not be hashed again.
    Thread-safe; never blocks on I/O while holding its lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple] = {}

    def remember(self, path: Path, fingerprint: tuple | None) -> None:
        if fingerprint is not None:
            with self._lock:
                self._seen[os.path.abspath(path)] = fingerprint

    def forget(self, path: Path) -> None:
        with self._lock:
            self._seen.pop(os.path.abspath(path), None)

    def holds(self, path: Path) -> bool:
        fingerprint = _fingerprint(path)
        with self._lock:
            return fingerprint is not None and self._seen.get(os.path.abspath(path)) == fingerprint


_verified = _VerifiedCheckpoints()


def checkpoint_root(model_dir: str | os.PathLike) -> Path:
    return Path(model_dir) / "checkpoints"


def save_checkpoint(model_dir: str | os.PathLike, step: int, variables: Mapping[str, np.ndarray], slots: Slots,
                    *, optimizer: Mapping[str, Any], mode: str, layout: Mapping[str, list[dict]] | None = None,
                    keep: int = 5, leases: Mapping[str, Any] | None = None) -> Path:
    """Write a checkpoint of `step` (with the lease book's state `leases`, if any) atomically, then keep it and the newest `keep` - 1 others that
    verify (damaged ones are moved aside, older ones deleted). Blocks.

    Raises CheckpointWriteError (a CheckpointError) naming the path when the filesystem fails,
    CheckpointError for bad arguments; nothing is left half-written either way.
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least one checkpoint must be kept")
    root = checkpoint_root(model_dir)
    manifest = _manifest(step, variables, slots, optimizer, mode, layout)
    if leases is not None:
        manifest["leases"] = dict(leases)
    final = root / f"ckpt-{step:010d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _writers_lock(root, exclusive=False):
            _write_in_place(root, final, manifest, variables, slots)
    except (OSError, SafetensorError) as e:
        raise CheckpointWriteError(
            f"could not write checkpoint step={step} to {root}: {e}; check that the model dir exists, is "
            "writable and that its disk has free space (--model_dir)") from e
    _verified.remember(final, _fingerprint(final))
    _prune(root, keep, final)
    return final


def load_latest_checkpoint(model_dir: str | os.PathLike) -> Checkpoint | None:
    """The newest checkpoint that verifies, or None if there is none.

    Damaged checkpoints on the way are moved aside with a warning that names them. None while
    damaged checkpoints exist is logged as an error naming them. Blocks.
    """
    for path in reversed(list_checkpoints(model_dir)):
        try:
            return read_checkpoint(path)
        except CheckpointError as e:
            log.warning("skipping damaged checkpoint %s: %s; %s; trying the previous one", path, e, _move_aside(path))
    damaged = list_damaged_checkpoints(model_dir)
    if damaged:
        log.error("no checkpoint in %s verifies; damaged ones were moved aside: %s. Nothing is restored: a new job "
                  "starts from step 0. To resume from one of them instead, repair it (its manifest.json has each "
                  "file's sha256) and rename it back to ckpt-<step>; delete them once they are no longer needed",
                  checkpoint_root(model_dir), ", ".join(str(p) for p in damaged))
    return None


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The global step a checkpoint directory `path` holds, by its name (ckpt-0000000042: 42);
    None for another name."""
    match = _DIR_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(model_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint directories, oldest first (temporary and damaged ones are not listed). Blocks."""
    root = checkpoint_root(model_dir)
    try:
        if not root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR_PATTERN.match(p.name)) and p.is_dir()]
    except OSError as e:
        raise CheckpointError(f"cannot list the checkpoints in {root}: {e}; check --model_dir") from e
    return [p for _, p in sorted(found)]


def list_damaged_checkpoints(model_dir: str | os.PathLike) -> list[Path]:
    """Damaged checkpoints moved aside (`damaged-ckpt-*`), by name. Blocks."""
    root = checkpoint_root(model_dir)
    try:
        return sorted(p for p in root.glob(f"{_DAMAGED_PREFIX}ckpt-*") if p.is_dir())
    except OSError:
        return []


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify one checkpoint directory. Raises CheckpointError if it is damaged. Blocks."""
    path = Path(path)
    fingerprint = _fingerprint(path)  # before reading: a change while reading must not pass as verified
    raw, manifest = _read_manifest(path)
    tensors = {}
    for name, entry in ((_VARIABLES_FILE, manifest.files.variables), (_OPTIMIZER_FILE, manifest.files.optimizer)):
        try:
            data = (path / name).read_bytes()
        except OSError as e:
            raise CheckpointError(f"{name} is missing or unreadable ({e})") from e
        _check_digest(name, hashlib.sha256(data).hexdigest(), entry)
        try:
            tensors[name] = load(data)
        except SafetensorError as e:
            raise CheckpointError(f"{name} is not a safetensors file ({e})") from e
    slots: Slots = {}
    for key, value in tensors[_OPTIMIZER_FILE].items():
        name, _, slot = key.rpartition(SLOT_SEPARATOR)
        slots.setdefault(name, {})[slot] = value
    _check_contents(manifest, tensors[_VARIABLES_FILE], slots)
    _verified.remember(path, fingerprint)
    return Checkpoint(path, manifest.step, tensors[_VARIABLES_FILE], slots, dict(manifest.optimizer), raw,
                      manifest.leases)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check one checkpoint's manifest and both files' sha256 without loading its tensors.

    Raises CheckpointError if it is damaged. Blocks (reads every byte).
    """
    path = Path(path)
    fingerprint = _fingerprint(path)
    _, manifest = _read_manifest(path)
    for name, entry in ((_VARIABLES_FILE, manifest.files.variables), (_OPTIMIZER_FILE, manifest.files.optimizer)):
        digest = hashlib.sha256()
        try:
            with open(path / name, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
        except OSError as e:
            raise CheckpointError(f"{name} is missing or unreadable ({e})") from e
        _check_digest(name, digest.hexdigest(), entry)
    _verified.remember(path, fingerprint)


def export_model(path: str | os.PathLike, variables: Mapping[str, np.ndarray], *, step: int) -> Path:
    """Write the final model as one safetensors file (loads without Shoal, e.g. with
    `safetensors.torch.load_file` into a module's `load_state_dict`). Atomic. Blocks.

    Raises CheckpointWriteError naming the path when the filesystem fails.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{_writer_tag()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            _write_tensors(tmp, variables, metadata={"format": "shoal-export", "step": str(step)})
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except (OSError, SafetensorError) as e:
        raise CheckpointWriteError(f"could not export the model to {path}: {e}; check that its directory is "
                                   "writable and that its disk has free space (--model_dir)") from e
    return path


def _manifest(step: int, variables: Mapping[str, np.ndarray], slots: Slots, optimizer: Mapping[str, Any], mode: str,
              layout: Mapping[str, list[dict]] | None) -> dict[str, Any]:
    """The manifest without its `files` (filled in once they are written), validated now so that
    a checkpoint is never written that could not be read back."""
    manifest = {
        "format": FORMAT, "version": VERSION, "step": int(step), "created_unix": time.time(),
        "optimizer": dict(optimizer), "mode": mode,
        "variables": {name: {"dtype": str(v.dtype), "shape": list(v.shape),
                             "shards": list((layout or {}).get(name, []))} for name, v in variables.items()},
        "slots": {name: sorted(per_slot) for name, per_slot in slots.items()},
    }
    from shoal.train.checkpoint_manifest import validate_new  # pydantic: only where checkpoints are written
    validate_new(manifest, step)
    return manifest


def _write_in_place(root: Path, final: Path, manifest: dict[str, Any], variables: Mapping[str, np.ndarray],
                    slots: Slots) -> None:
    """Write the checkpoint into a temporary directory of its own and rename it to `final`."""
    tag = _writer_tag()
    tmp = root / f".tmp-{final.name}-{tag}"
    tmp.mkdir()
    replaced = None
    try:
        flat_slots = {f"{name}{SLOT_SEPARATOR}{slot}": value
                      for name, per_slot in slots.items() for slot, value in per_slot.items()}
        files = {_VARIABLES_FILE: _write_tensors(tmp / _VARIABLES_FILE, variables),
                 _OPTIMIZER_FILE: _write_tensors(tmp / _OPTIMIZER_FILE, flat_slots)}
        _write_durably(tmp / _MANIFEST_FILE, json.dumps({**manifest, "files": files}, indent=1).encode())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (at the end, right after a periodic save)
            replaced = root / f".old-{final.name}-{tag}"
            _verified.forget(final)
            os.rename(final, replaced)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if replaced is not None and not final.exists():
            _put_back(replaced, final)
        raise
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def _prune(root: Path, keep: int, written: Path) -> None:
    """Keep `written` and the newest `keep` - 1 other checkpoints that verify; move damaged ones
    aside and delete the rest. Then remove temporary directories of writers that died. A
    failure here is a warning: the checkpoint was saved."""
    try:
        kept = 1
        for path in reversed(list_checkpoints(root.parent)):
            if path == written:
                continue
            if kept >= keep:
                _verified.forget(path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not _verified.holds(path):
                try:
                    verify_checkpoint(path)
                except CheckpointError as e:
                    log.warning("checkpoint %s is damaged (%s); %s, so that it does not shadow good ones",
                                path, e, _move_aside(path))
                    continue
            kept += 1
        _remove_stale_temp_dirs(root)
    except (OSError, CheckpointError) as e:
        log.warning("saved %s but could not prune the checkpoints beside it: %s", written, e)


def _move_aside(path: Path) -> str:
    """Rename a damaged checkpoint to `damaged-<name>[-N]`; says what it did, for a log line."""
    _verified.forget(path)
    for n in range(1, 1000):
        target = path.with_name(f"{_DAMAGED_PREFIX}{path.name}" + (f"-{n}" if n > 1 else ""))
        if target.exists():
            continue
        try:
            os.rename(path, target)
        except OSError as e:
            return f"could not move it aside ({e}), so it stays where it is"
        return f"moved it aside to {target} for inspection (delete it once no longer needed)"
    return "could not move it aside (too many damaged copies of this step), so it stays where it is"


def _remove_stale_temp_dirs(root: Path) -> None:
    """Remove what saves that died left behind, unless a save is under way (its temp dir is live)."""
    with _writers_lock(root, exclusive=True) as alone:
        if not alone:
            return
        for stale in root.iterdir():
            if not (m := _STALE_PATTERN.match(stale.name)):
                continue
            final = root / m.group(2)
            if m.group(1) == "old" and not final.exists():  # died between moving it out and the new one in
                _put_back(stale, final)
            else:
                shutil.rmtree(stale, ignore_errors=True)


def _put_back(replaced: Path, final: Path) -> None:
    try:
        os.rename(replaced, final)
    except OSError as e:
        log.warning("could not put the previous checkpoint %s back to %s: %s", replaced, final, e)


@contextmanager
def _writers_lock(root: Path, exclusive: bool) -> Iterator[bool]:
    """Hold `root/.writers.lock`: shared (blocks while a cleanup holds it; yields True) or
    exclusive (does not block; yields whether it got it). Where the filesystem has no locks,
    shared goes on unlocked and exclusive yields False (stale temp dirs are then left)."""
    fd = os.open(root / _WRITERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
            got = True
        except BlockingIOError:
            got = False
        except OSError as e:  # ENOLCK, EOPNOTSUPP: e.g. NFS mounted without a lock manager
            log.debug("cannot lock %s (%s); going on without", root / _WRITERS_LOCK, e)
            got = not exclusive
        yield got
    finally:
        os.close(fd)  # releases the lock


def _writer_tag() -> str:
    """Unique to one save: host and pid for a person looking at the directory, and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _read_manifest(path: Path):
    from shoal.train.checkpoint_manifest import read_manifest  # pydantic: only where checkpoints are read
    return read_manifest(path)


def _check_digest(name: str, digest: str, entry) -> None:
    if digest != entry.sha256:
        raise CheckpointError(f"{name} does not match its sha256 in the manifest (corrupt or cut short)")


def _check_contents(manifest, variables: Mapping[str, np.ndarray], slots: Slots) -> None:
    """The tensors must be the ones the manifest lists: same names, dtypes, shapes and slots."""
    listed = {name: (v.dtype, tuple(v.shape)) for name, v in manifest.variables.items()}
    found = {name: (str(v.dtype), tuple(v.shape)) for name, v in variables.items()}
    for name in sorted(listed.keys() | found.keys()):
        if listed.get(name) != found.get(name):
            raise CheckpointError(f"variable {name!r} is {found.get(name) or 'missing'} in {_VARIABLES_FILE} but "
                                  f"{listed.get(name) or 'missing'} in the manifest")
    listed_slots = {name: sorted(s) for name, s in manifest.slots.items() if s}
    found_slots = {name: sorted(s) for name, s in slots.items()}
    if listed_slots != found_slots:
        raise CheckpointError(f"{_OPTIMIZER_FILE} holds slots {found_slots} but the manifest lists {listed_slots}")


def _fingerprint(path: Path) -> tuple | None:
    """Inode, size and times of the checkpoint's files: they change when a file is rewritten."""
    try:
        return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                     for name in _FILES for st in (os.stat(path / name),))
    except OSError:
        return None


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
