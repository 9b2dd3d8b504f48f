"""What a task imports decides how fast it starts and how much memory a ps holds: a ps loads no
training machinery, and a worker loads pydantic only when it reads or writes a checkpoint."""

import subprocess
import sys


def loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return set(out.split())


def test_a_ps_task_loads_no_session_checkpoints_or_summaries():
    modules = loaded_after("import shoal\nshoal.serve_unless_training\nshoal.add_training_flags\nshoal.Server")
    assert "shoal.ps.server" in modules
    assert not {"shoal.train.session", "safetensors", "tensorboardX", "pydantic"} & modules


def test_a_worker_session_loads_no_pydantic_until_it_touches_a_checkpoint():
    modules = loaded_after("import shoal\nshoal.TrainingSession")
    assert "shoal.train.session" in modules and "pydantic" not in modules


def test_a_ps_task_of_a_pytorch_program_loads_no_torch():
    modules = loaded_after("import shoal.torch\nshoal.torch.init\nshoal.torch.add_flags\nshoal.torch.Job")
    assert "shoal.torch.job" in modules and "shoal.ps.server" in modules
    assert not {"torch", "shoal.train.session", "safetensors"} & modules
