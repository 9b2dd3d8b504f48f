"""The GPUs a launcher (or a host agent) may hand out to its tasks.

When CUDA_VISIBLE_DEVICES is set in the environment given, those are the GPUs: a user who keeps
a job to some GPUs of a shared machine (`CUDA_VISIBLE_DEVICES=2,3 shoal train job.yaml`), or
Slurm, which sets it for a step to the GPUs it holds. Otherwise every GPU nvidia-ml-py counts,
"0".."N-1". A task's CUDA_VISIBLE_DEVICES is made of these names (indexes, or UUIDs such as
`GPU-8b75...` and `MIG-...`, as given), so a task never lands on a GPU its launcher was kept off.

`visible_gpus` blocks briefly (NVML) when the variable is unset; the rest is pure. Thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


def parse_visible_devices(value: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: comma-separated indexes or UUIDs; an empty or a
    negative entry ends the list ("-1" and "" hide every GPU)."""
    out = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return tuple(out)


def visible_gpus(environ: Mapping[str, str]) -> VisibleGpus:
    """The GPUs `environ`'s CUDA_VISIBLE_DEVICES names when it is set, else every GPU that
    nvidia-ml-py counts on this host (none without it or a driver)."""
    if VARIABLE in environ:
        value = environ[VARIABLE]
        return VisibleGpus(parse_visible_devices(value), f"{VARIABLE}={value}")
    return VisibleGpus(tuple(str(i) for i in range(gpu_count())))
