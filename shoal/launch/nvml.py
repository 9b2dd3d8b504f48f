"""This host's NVIDIA GPUs through nvidia-ml-py (`pynvml`), when it is installed: how many
there are, and which processes use them. Without it (or a driver) there are none.
Each call initialises and shuts down NVML; blocking briefly; thread-safe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def gpu_count() -> int:
    """How many NVIDIA GPUs this host has (0 without nvidia-ml-py or a driver)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as NVML names it: its UUID ("GPU-...") and model ("NVIDIA H200"), each None
    when NVML could not read it."""

    uuid: Optional[str]
    model: Optional[str]


def gpu_identities() -> list[GpuIdentity]:
    """Each of this host's NVIDIA GPUs, by NVML's index (PCI bus order); none without
    nvidia-ml-py or a driver. A GPU NVML cannot read keeps its place, with None in it."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        return [_identity(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def _identity(pynvml, index: int) -> GpuIdentity:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return GpuIdentity(None, None)
    return GpuIdentity(_text(pynvml.nvmlDeviceGetUUID, handle, pynvml.NVMLError),
                       _text(pynvml.nvmlDeviceGetName, handle, pynvml.NVMLError))


def _text(read, handle, error: type) -> Optional[str]:
    try:
        value = read(handle)
    except error:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_usage() -> Optional[list[tuple[int, float, int]]]:
    """(pid, device utilization %, GPU memory bytes) per GPU process; None without NVML."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out.append((proc.pid, util, int(proc.usedGpuMemory or 0)))
        return out
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
