"""This host's NVIDIA GPUs through nvidia-ml-py (`pynvml`), when it is installed: how many
there are, and which processes use them. Without it (or a driver) there are none.
Each call initialises and shuts down NVML; blocking briefly; thread-safe."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional


@contextmanager
def _nvml() -> Iterator[Optional[object]]:
    """NVML initialised for the block: the pynvml module, or None without nvidia-ml-py or a
    driver. Shut down after the block."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def gpu_count() -> int:
    """How many NVIDIA GPUs this host has (0 without nvidia-ml-py or a driver)."""
    with _nvml() as pynvml:
        if pynvml is None:
            return 0
        try:
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError:
            return 0


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as NVML names it: its UUID ("GPU-...") and model ("NVIDIA H200"), each None
    when NVML could not read it."""

    uuid: Optional[str]
    model: Optional[str]


def gpu_identities() -> list[GpuIdentity]:
    """Each of this host's NVIDIA GPUs, by NVML's index (PCI bus order); none without
    nvidia-ml-py or a driver. A GPU NVML cannot read keeps its place, with None in it."""
    with _nvml() as pynvml:
        if pynvml is None:
            return []
        try:
            return [_identity(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:
            return []


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
    with _nvml() as pynvml:
        if pynvml is None:
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
