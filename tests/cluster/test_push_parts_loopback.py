"""A session whose ps is on loopback pushes a large variable in parts of one wire chunk (the default
part size there, shoal/train/part_size.py), against a real ps: every row of every part is applied
and comes back into `params`, as single-process SGD computes it."""

from __future__ import annotations


import numpy as np

import shoal
from shoal.train.part_size import LOOPBACK_PART_BYTES
from tests.cluster.ps_process import config_for, secret_of, start_ps, wait_until_serving

MiB = 1 << 20


def test_default_parts_on_loopback_apply_every_row_of_a_large_variable(make_cluster):
    cluster = make_cluster(1, 1)
    ps = start_ps(cluster)
    wait_until_serving(cluster)
    rng = np.random.default_rng(0)
    value = rng.normal(size=(3001, 1000)).astype(np.float32)  # ~11.4 MiB: 3 parts of ~3.8 MiB
    grads = [rng.normal(size=value.shape).astype(np.float32) for _ in range(3)]
    session = shoal.TrainingSession(config_for(cluster, "worker", 0), {"w": value}, shoal.SGD(0.5),
                                    secret=secret_of(cluster), request_timeout_s=60)
    assert [s.nbytes <= LOOPBACK_PART_BYTES for s in session.placement.shards] == [True] * 3
    expected = value.copy()
    with session:
        for grad in grads:
            session.push({"w": grad})
            expected -= np.float32(0.5) * grad
            np.testing.assert_array_equal(session.params["w"], expected)
        session.pull()  # what the ps holds, read back on its own
        np.testing.assert_array_equal(session.params["w"], expected)
    assert ps.wait(30) == 0, cluster.dump()
