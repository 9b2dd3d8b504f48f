"""The GPUs a launcher (or a host agent) may hand out to its tasks.

When CUDA_VISIBLE_DEVICES is set in the environment given, those are the GPUs: a user who keeps
a job to some GPUs of a shared machine (`CUDA_VISIBLE_DEVICES=2,3 shoal train job.yaml`), or
Slurm, which sets it for a step to the GPUs it holds. Otherwise every GPU nvidia-ml-py counts,
"0".."N-1". A task's CUDA_VISIBLE_DEVICES is made of these names (indexes, or UUIDs such as
`GPU-8b75...` and `MIG-...`, as given), so a task never lands on a GPU its launcher was kept off;
entries CUDA would not use (an index past the host's GPUs, junk, a name given twice) are not handed
out either; a GPU named in two ways (its index and its UUID) is handed out once, and a UUID of no
GPU of the host ends the list, as CUDA does.

`visible_gpus` blocks briefly (NVML) unless the variable names no GPU; the rest is pure.
Thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from shoal.launch.nvml import gpu_count, gpu_uuids

VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs of one host that its tasks may be given, in order. `limited_by` is
    "CUDA_VISIBLE_DEVICES=..." when the environment chose them, "" when NVML counted them."""

    ids: tuple[str, ...] = ()
    limited_by: str = ""

    def __len__(self) -> int:
        return len(self.ids)


def parse_visible_devices(value: str, count: Optional[int] = None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: comma-separated indexes (read as strtoul does:
    " 1", "+1" and "1x" are 1) or UUIDs (`GPU-...`, `MIG-...`, case as given). The first entry
    that is neither (empty, negative, "none", Slurm's "NoDevFiles") ends the list, and so does an
    index of `count` or more when this host's GPU count is known; "-1" and "" hide every GPU. A
    name given twice makes CUDA refuse to start (CUDA_ERROR_INVALID_DEVICE): no GPU at all."""
    out: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            name = entry
        else:
            digits = re.match(r"\+?(\d+)", entry)
            if digits is None or (count is not None and int(digits.group(1)) >= count):
                break
            name = str(int(digits.group(1)))
        if name in out:
            return ()
        out.append(name)
    return tuple(out)


def known_gpus(ids: tuple[str, ...], uuids: Sequence[str]) -> tuple[str, ...]:
    """`ids` as CUDA reads them on a host whose GPUs have `uuids` (by index; none: the names are
    kept as given): a UUID that names none of them (nor, as a prefix, exactly one) ends the list,
    and a GPU already named another way (its index and its UUID, a UUID and its prefix) is kept
    once. Both seen on an H200 (tests/gpu/test_gpu_visible_devices.py): `GPU-ffff...,0` is no
    device and `0,GPU-<its UUID>` is one. A prefix of two UUIDs (not seen: one GPU there) is taken
    as naming none, so that no task gets a GPU CUDA might not show. MIG names are kept as given."""
    if not uuids:
        return ids
    seen: set[str] = set()
    out: list[str] = []
    for name in ids:
        gpu = _uuid_of(name, uuids)
        if gpu is None:
            break
        if gpu not in seen:
            seen.add(gpu)
            out.append(name)
    return tuple(out)


def _uuid_of(name: str, uuids: Sequence[str]) -> Optional[str]:
    """The UUID of the GPU that `name` (an index, a UUID or a unique prefix of one) names on a
    host with `uuids`; None for a GPU UUID that names none of them; a MIG name itself."""
    if name.isdigit():
        return uuids[int(name)] if int(name) < len(uuids) else None
    if not name.startswith("GPU-"):
        return name
    matches = [u for u in uuids if u.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def visible_gpus(environ: Mapping[str, str]) -> VisibleGpus:
    """The GPUs `environ`'s CUDA_VISIBLE_DEVICES names when it is set (checked against
    nvidia-ml-py's GPUs when it has any: see known_gpus), else every GPU that nvidia-ml-py
    counts on this host (none without it or a driver)."""
    if VARIABLE in environ:
        value = environ[VARIABLE]
        ids = parse_visible_devices(value)
        if ids:
            uuids = gpu_uuids()  # none: NVML cannot tell, so the names are trusted
            ids = known_gpus(parse_visible_devices(value, len(uuids) or None), uuids)
        return VisibleGpus(ids, f"{VARIABLE}={value}")
    return VisibleGpus(tuple(str(i) for i in range(gpu_count())))
