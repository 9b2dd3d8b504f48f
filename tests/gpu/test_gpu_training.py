"""shoal.torch with the model on the GPU: the parameters are copies of the ps values there
(not views, as on the CPU), refreshed after every step. The training matches torch.optim in one
process and resumes from a checkpoint with its BatchNorm buffers. (The MNIST example trains on
the GPU alone in tests/cluster/test_torch_api.py, and beside a CPU chief in test_gpu_launcher.py.)"""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from tests.cluster.harness import REPO  # noqa: E402

PROGRAM = "tests/cluster/programs/torch_bn.py"
_spec = importlib.util.spec_from_file_location("torch_bn", REPO / PROGRAM)
torch_bn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_bn)


def assert_state_dicts_close(got, want):
    assert got.keys() == want.keys()
    for name in want:  # float32 on the GPU rounds differently from the CPU oracle
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


def run_bn_job(make_cluster, *flags, num_ps=1):
    cluster = make_cluster(num_ps=num_ps, num_workers=1)
    cluster.start_all([PROGRAM, "--sync", "--device", "cuda", *flags])
    codes = cluster.wait_all(timeout=180)
    assert codes == {**{f"ps:{i}": 0 for i in range(num_ps)}, "worker:0": 0}, cluster.dump()
    return cluster


@pytest.mark.parametrize("kind, num_ps", [("sgd", 1), ("adamw", 2)])
def test_a_model_on_the_gpu_trains_as_torch_optim_does_and_resumes(make_cluster, tmp_path, kind, num_ps):
    model_dir = tmp_path / "model"
    run_bn_job(make_cluster, "--optimizer", kind, "--steps", "6", "--out", str(tmp_path / "first.safetensors"),
               "--model_dir", str(model_dir), num_ps=num_ps)
    assert_state_dicts_close(load_file(tmp_path / "first.safetensors"), torch_bn.train_oracle(kind, 6))

    cluster = run_bn_job(make_cluster, "--optimizer", kind, "--steps", "12", "--out",
                         str(tmp_path / "second.safetensors"), "--model_dir", str(model_dir), num_ps=num_ps)
    assert "worker:0 starts at step 6" in cluster.tasks[-1].output()
    assert_state_dicts_close(load_file(tmp_path / "second.safetensors"), torch_bn.train_oracle(kind, 12))
