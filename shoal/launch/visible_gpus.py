"""The GPUs a launcher (or a host agent) may hand out to its tasks.

When CUDA_VISIBLE_DEVICES is set in the environment given, those are the GPUs: a user who keeps
a job to some GPUs of a shared machine (`CUDA_VISIBLE_DEVICES=2,3 shoal train job.yaml`), or
Slurm, which sets it for a step to the GPUs it holds. Otherwise every GPU nvidia-ml-py counts,
"0".."N-1". A task's CUDA_VISIBLE_DEVICES is made of these names (indexes, or UUIDs such as
`GPU-8b75...` and `MIG-...`, as given), so a task never lands on a GPU its launcher was kept off;
entries CUDA would not use are not handed out either: the list ends at an index past the host's
GPUs, junk, a `GPU-` UUID of no GPU of the host, or a GPU named again by the other kind of name
(by its index and by its UUID, in either order); a GPU named again the same way (`0,0`, or a
UUID and a prefix of it) before the list ended hides every GPU, as CUDA does (see known_gpus
for what NVML must tell).

`visible_gpus` blocks briefly (NVML) unless the variable names no GPU; the rest is pure.
Thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from shoal.launch.nvml import GpuIdentity, gpu_count, gpu_identities

VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs of one host that its tasks may be given, in order. `limited_by` is
    "CUDA_VISIBLE_DEVICES=..." when the environment chose them, "" when NVML counted them;
    `unchecked`: the environment named GPUs that NVML could not check (no nvidia-ml-py, or no
    driver), so they are taken as named."""

    ids: tuple[str, ...] = ()
    limited_by: str = ""
    unchecked: bool = False

    def __len__(self) -> int:
        return len(self.ids)


def unchecked_notice(visible: VisibleGpus, host: str) -> str:
    """The launcher's line for GPUs that `host` ("this host", or a host's name) hands out
    unchecked (`visible.unchecked`)."""
    return (f"shoal | {visible.limited_by} names the GPUs tasks get on {host}, unchecked: nvidia-ml-py cannot see"
            " its GPUs (not installed, or no NVIDIA driver), so a GPU it names that the host lacks leaves its task"
            " on the CPU; pip install nvidia-ml-py there to have them checked")


def parse_visible_devices(value: str, count: Optional[int] = None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES's entries as CUDA reads them: comma-separated indexes (read as
    strtoul does: " 1", "+1" and "1x" are 1) or UUIDs (`GPU-...`, `MIG-...`, case as given). The
    first entry that is neither (empty, negative, "none", Slurm's "NoDevFiles") ends the list,
    and so does an index of `count` or more when this host's GPU count is known; "-1" and ""
    hide every GPU. Names given twice are kept here: known_gpus reads them."""
    out: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
            continue
        digits = re.match(r"\+?(\d+)", entry)
        if digits is None or (count is not None and int(digits.group(1)) >= count):
            break
        out.append(str(int(digits.group(1))))
    return tuple(out)


def known_gpus(ids: tuple[str, ...], uuids: Sequence[Optional[str]], by_index: bool) -> tuple[str, ...]:
    """The GPUs CUDA shows for the entries `ids`, in order, on a host whose GPUs have `uuids`
    (NVML's, None where it could not read one; none at all: the names are taken as given).
    CUDA reads the entries in order until one names no GPU: a `GPU-` UUID that no GPU has, or
    that, as a prefix, two have. A GPU named again ends the list there when it is named the
    other way (its index, then its UUID or a prefix of it, or the other way round; `by_index`:
    CUDA numbers the GPUs as NVML does, see visible_gpus), and hides every GPU when it is named
    the same way (`0,0`; a UUID and a prefix of it). MIG names are taken as given. Measured on
    an H200 (tests/gpu/test_gpu_visible_devices.py; the table in
    tests/unit/test_launch_visible_gpus.py): `GPU-ffff...,0` is no device, `0,GPU-<its UUID>,0`
    one, `0,0,GPU-<its UUID>` none, `GPU-<its UUID>,GPU-<its prefix>` none."""
    named: dict[str, bool] = {}  # each GPU named so far: whether by index
    out: list[str] = []
    for name in ids:
        gpu = _gpu_of(name, uuids, by_index)
        if gpu is None:
            break
        by_its_index = name.isdigit()
        if gpu in named:
            if named[gpu] == by_its_index:
                return ()
            break
        named[gpu] = by_its_index
        out.append(name)
    return tuple(out)


def _gpu_of(name: str, uuids: Sequence[Optional[str]], by_index: bool) -> Optional[str]:
    """What tells the GPU `name` names apart on a host with `uuids`: its UUID where that is
    known, else the name itself ("#i" for an index); None for a `GPU-` name that no GPU has, or
    two have, when every UUID is known (one NVML could not read might be it)."""
    if name.isdigit():
        index = int(name)
        known = by_index and index < len(uuids) and uuids[index] is not None
        return uuids[index] if known else f"#{index}"
    if not name.startswith("GPU-") or not uuids:
        return name
    matches = [u for u in uuids if u is not None and u.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    return None if matches or None not in uuids else name


def visible_gpus(environ: Mapping[str, str]) -> VisibleGpus:
    """The GPUs `environ`'s CUDA_VISIBLE_DEVICES names when it is set (checked against
    nvidia-ml-py's GPUs when it has any: see known_gpus), else every GPU that nvidia-ml-py
    counts on this host (none without it or a driver)."""
    if VARIABLE in environ:
        value = environ[VARIABLE]
        ids = parse_visible_devices(value)
        gpus: list[GpuIdentity] = []
        if ids:
            gpus = gpu_identities()  # none: NVML cannot tell, so the names are trusted
            ids = parse_visible_devices(value, len(gpus) or None)
        ids = known_gpus(ids, [g.uuid for g in gpus], _numbered_as_nvml(environ, gpus))
        return VisibleGpus(ids, f"{VARIABLE}={value}", unchecked=bool(ids) and not gpus)
    return VisibleGpus(tuple(str(i) for i in range(gpu_count())))


def _numbered_as_nvml(environ: Mapping[str, str], gpus: Sequence[GpuIdentity]) -> bool:
    """Whether CUDA's index i is NVML's GPU i: CUDA_DEVICE_ORDER=PCI_BUS_ID says so; CUDA's
    default order (fastest first) is NVML's in practice when every GPU is the same model, and
    may not be on a host of mixed models, where an index is then not matched to a UUID."""
    if environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return True
    models = {g.model for g in gpus}
    return len(models) == 1 and None not in models
