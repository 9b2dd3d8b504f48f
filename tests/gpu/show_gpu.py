"""Prints what a task sees of the GPUs: its CUDA_VISIBLE_DEVICES and the device torch gets."""

import os

import torch

visible = os.environ.get("CUDA_VISIBLE_DEVICES")
if torch.cuda.is_available():
    uuid = torch.cuda.get_device_properties(0).uuid
    print(f"visible={visible!r} device={torch.cuda.get_device_name(0)} uuid=GPU-{uuid}", flush=True)
else:
    print(f"visible={visible!r} device=cpu", flush=True)
