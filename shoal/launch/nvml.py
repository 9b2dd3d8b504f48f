"""This host's NVIDIA GPUs through nvidia-ml-py (`pynvml`), when it is installed: how many
there are, and which processes use them. Without it (or a driver) there are none.
Each call initialises and shuts down NVML; blocking briefly; thread-safe."""

from __future__ import annotations

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


def gpu_uuids() -> list[str]:
    """The UUID ("GPU-...") of each of this host's NVIDIA GPUs, by index (none without
    nvidia-ml-py or a driver)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        return [u.decode() if isinstance(u, bytes) else str(u) for u in uuids]
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


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
