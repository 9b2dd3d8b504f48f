"""The GPUs a launcher (or a host agent) may hand out to its tasks.

When CUDA_VISIBLE_DEVICES is set in the environment given, those are the GPUs: a user who keeps
a job to some GPUs of a shared machine (`CUDA_VISIBLE_DEVICES=2,3 shoal train job.yaml`), or
Slurm, which sets it for a step to the GPUs it holds. Otherwise every GPU nvidia-ml-py counts,
"0".."N-1". A task's CUDA_VISIBLE_DEVICES is made of these names (indexes, or UUIDs such as
`GPU-8b75...` and `MIG-...`, as given), so a task never lands on a GPU its launcher was kept off;
entries CUDA would not use (an index past the host's GPUs, junk, a name given twice) are not handed
out either.

`visible_gpus` blocks briefly (NVML) when the variable is unset or names an index; the rest is
pure. Thread-safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from shoal.launch.nvml import gpu_count

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


def visible_gpus(environ: Mapping[str, str]) -> VisibleGpus:
    """The GPUs `environ`'s CUDA_VISIBLE_DEVICES names when it is set (its indexes checked
    against nvidia-ml-py's count when it has one), else every GPU that nvidia-ml-py counts on
    this host (none without it or a driver)."""
    if VARIABLE in environ:
        value = environ[VARIABLE]
        ids = parse_visible_devices(value)
        if any(i.isdigit() for i in ids):
            ids = parse_visible_devices(value, gpu_count() or None)  # 0: NVML cannot tell, so trust it
        return VisibleGpus(ids, f"{VARIABLE}={value}")
    return VisibleGpus(tuple(str(i) for i in range(gpu_count())))
