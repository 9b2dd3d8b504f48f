"""The PyTorch example's ps tasks take the replication flags (issue 14): `shoal.torch.init`
passes `--replicate_every_secs` / `--replicate_every_steps` to the ps it serves, as
`shoal.serve_unless_training(..., replication=...)` does for examples/mnist_softmax.py."""

import pytest

pytest.importorskip("torch")


def test_torch_example_ps_replicates_to_its_successor_when_given_replicate_every_secs(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=1)
    ps0 = cluster.start("ps", 0, ["examples/mnist_mlp_torch.py", "--replicate_every_secs", "2"])
    ps0.wait_for_output("ps:0 replicates the shards it holds (if any) to ps:1", timeout=60)
    assert "every 2s" in ps0.output(), ps0.output()
