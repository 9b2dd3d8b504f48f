"""What the GPU tests ask NVML directly (nvidia-ml-py), beside what Shoal itself reads."""


def gpu_uuid(index: int) -> str:
    """The UUID ("GPU-...") of this host's GPU `index`, as CUDA_VISIBLE_DEVICES takes it."""
    import pynvml
    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()
    return uuid.decode() if isinstance(uuid, bytes) else uuid
