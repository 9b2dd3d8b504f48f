"""Prints what a task sees of the GPUs: its CUDA_VISIBLE_DEVICES and the device torch gets.

With `--done-dir DIR`, a worker leaves a file there once it has printed, and the chief waits
(up to 120 s) for the worker's before it exits: a chief that ends the job first would have
the launcher stop a worker still starting CUDA, before its line.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--done-dir", type=Path)
args = parser.parse_args()
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})

visible = os.environ.get("CUDA_VISIBLE_DEVICES")
if torch.cuda.is_available():
    uuid = torch.cuda.get_device_properties(0).uuid
    print(f"visible={visible!r} device={torch.cuda.get_device_name(0)} uuid=GPU-{uuid}", flush=True)
else:
    print(f"visible={visible!r} device=cpu", flush=True)

if args.done_dir is not None:
    if task.get("type") == "worker":
        (args.done_dir / f"worker.{task.get('index')}").touch()
    elif task.get("type") == "chief":
        end = time.monotonic() + 120
        while not any(args.done_dir.glob("worker.*")) and time.monotonic() < end:
            time.sleep(0.1)
