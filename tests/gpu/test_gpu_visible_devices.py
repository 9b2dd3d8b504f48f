"""Shoal reads CUDA_VISIBLE_DEVICES as CUDA does on this host: for each value, the number of GPUs
the launcher would hand out (visible_gpus) is the number of devices torch sees in a process
started with it. The values name this host's first GPU by index, by UUID and by a prefix of it,
twice in two ways (an index and a UUID: one GPU; a UUID and its prefix: none), past the host's
GPUs, and not at all."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from shoal.launch.nvml import gpu_count
from shoal.launch.visible_gpus import visible_gpus
from tests.gpu.gpus import gpu_uuid

pytestmark = pytest.mark.timeout(120)

COUNT = "import torch; print(torch.cuda.device_count())"


def cuda_device_count(value: str) -> int:
    """How many devices torch sees in a fresh process with CUDA_VISIBLE_DEVICES=`value`."""
    out = subprocess.run([sys.executable, "-c", COUNT], env={**os.environ, "CUDA_VISIBLE_DEVICES": value},
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_shoal_hands_out_as_many_gpus_as_cuda_shows():
    count, first = gpu_count(), gpu_uuid(0)
    past, prefix, unknown = str(count), first[:12], "GPU-ffffffff-0000"
    values = ["0", first, f"0,{first}", f"{first},0", prefix, f"{prefix},0", f"0,{prefix}", f"{first},{prefix}",
              f"{prefix},{first}", f"{first[:8]},{prefix}", f"0,{first},{prefix}", f"{first},0,0", f"{first},{unknown}",
              f"0,0,{first}", f"{prefix},0,{first}", f"0,{first},0",
              first.lower(),
              "0,0", past, f"0,{past}", unknown, f"0,{unknown}", f"{unknown},0", "", "-1", "none", "NoDevFiles"]
    with ThreadPoolExecutor(8) as pool:
        cuda = dict(zip(values, pool.map(cuda_device_count, values)))
    table = [(v, len(visible_gpus({"CUDA_VISIBLE_DEVICES": v})), cuda[v]) for v in values]
    print("\n".join(f"{v!r:60} shoal {s} cuda {c}" for v, s, c in table))
    assert [row for row in table if row[1] != row[2]] == []
