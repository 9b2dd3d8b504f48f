"""The host agent on a GPU host, as the ssh and Slurm executors use it: `bind` with GPUs names
them, and the one-shot usage report (`--find JOB --usage S`, what `shoal monitor` runs on a
remote host) shows the device memory of the job's GPU process and of no other."""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from shoal.launch.executor import TaskRef
from shoal.launch.job_scan import find_args, read_report, task_usage
from shoal.launch.nvml import gpu_count
from tests.gpu.gpus import gpu_uuid

pytestmark = pytest.mark.timeout(120)

HOLDS_GPU_MEMORY = (
    "import sys, time, torch\n"
    "x = torch.ones(64 * 1024 * 1024, device='cuda')  # 256 MiB\n"
    "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(120)\n"
)


def agent_gpus(**env: str) -> dict:
    """The "ports" reply of an agent asked to bind with GPUs, started with `env` over this one
    (CUDA_VISIBLE_DEVICES removed first), as a Slurm step or an ssh login would start it."""
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    agent = subprocess.run([sys.executable, "-m", "shoal.launch.agent"], input=b'{"type": "bind", "count": 1, '
                           b'"interface": "127.0.0.1", "gpus": true}\n{"type": "stop"}\n', capture_output=True,
                           env={**environ, **env}, timeout=60)
    [ports] = [r for r in map(json.loads, agent.stdout.splitlines()) if r["type"] == "ports"]
    return ports


def test_bind_names_the_gpus_and_the_usage_report_shows_the_jobs_gpu_memory(tmp_path):
    count = gpu_count()
    assert count >= 1 and agent_gpus()["gpus"] == [str(i) for i in range(count)]
    uuid = gpu_uuid(count - 1)  # as a Slurm step that holds the last GPU has it
    named = agent_gpus(CUDA_VISIBLE_DEVICES=uuid)
    assert (named["gpus"], named["gpus_from"]) == ([uuid], f"CUDA_VISIBLE_DEVICES={uuid}")
    assert agent_gpus(CUDA_VISIBLE_DEVICES=f"{count - 1},{count}")["gpus"] == [str(count - 1)]  # CUDA's reading

    job_id = "gpujob-" + os.urandom(4).hex()
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_GPU_MEMORY], stdout=subprocess.PIPE,
                              env=dict(os.environ, SHOAL_JOB_ID=job_id), start_new_session=True)
    try:
        assert holder.stdout.readline() == b"ready\n"
        report = subprocess.run([sys.executable, "-m", "shoal.launch.agent", *find_args(job_id, usage=0.2)],
                                capture_output=True, timeout=60)
        scan = read_report("gpuhost", report.stdout)
        assert scan is not None and not scan.error, report
        assert [p.pid for p in scan.processes] == [holder.pid]
        ref = TaskRef("ssh", holder.pid, psutil.Process(holder.pid).create_time(), "gpuhost")
        usage = task_usage(scan, ref)
        assert usage is not None and usage.gpu_mem_used >= 256 * 1024 * 1024, (usage, scan.gpus)
        other = TaskRef("ssh", os.getpid(), psutil.Process(os.getpid()).create_time(), "gpuhost")
        assert task_usage(scan, other) is None  # this test process is no task of the job
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
