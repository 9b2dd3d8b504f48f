"""Re-homing and coordinator closures: the gradients a sync push resends to a moved shard's new
ps carry the push's closure tag, so a re-run of that closure applies them nowhere a second time
(the ps's exactly-once closure ledger, shoal/ps/closure_ledger.py)."""

import numpy as np

import shoal
from shoal.ps.client import PsClient
from shoal.ps.protocol import AdoptRequest, ClosureTag, PushOutcome
from shoal.train.rehome_placement import rehome
from shoal.train.rehoming import PsRehomed, resend_moved
from tests.cluster.ps_process import config_for, secret_of, start_ps

LR = 0.5


def test_a_resent_closure_push_is_counted_once_when_the_closure_runs_again(make_cluster):
    cluster = make_cluster(num_ps=2, num_workers=0, chief=True)
    for i in range(2):
        start_ps(cluster, i)
    model = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    secret = secret_of(cluster)
    with shoal.TrainingSession(config_for(cluster, "chief", 0), model, shoal.SGD(LR), secret=secret, sync=True,
                               placement=shoal.PlacementStrategy.ROUND_ROBIN,
                               init_timeout_s=30, min_shard_bytes=1 << 20) as session:
        old = session.placement
        assert [s.name for s in old.on_ps(1)] == ["b"]
        new = rehome(old, 1)
        client = PsClient(cluster.spec["ps"][:1], secret, timeout_s=30)  # ps:0, the survivor
        try:
            into = {name: np.zeros(4, np.float32) for name in model}
            grads = {name: np.ones(4, np.float32) for name in model}
            tag = ClosureTag("c.1", 0)
            client.adopt(0, AdoptRequest(1, 0, (1,)), {"b": model["b"]})  # ps:1's shard moves to ps:0 at step 0
            # the closure's push of step 0: its part for ps:0 arrived; its part for ps:1 went to the lost ps
            client.push_all("chief:0", 0, [(0, {"a": grads["a"]})], into, closure=tag)
            resend_moved(client, "chief:0", 0, PsRehomed("ps:1 re-homed", 1, old, new), grads, None, into,
                         closure=tag)
            np.testing.assert_array_equal(into["b"], model["b"] - LR)
            # the closure runs again (its worker died after the push): ps:0 applied all of it already
            answers = client.push_all("chief:0", 1, [(0, {"a": grads["a"], "b": grads["b"]})], into, closure=tag)
            assert [a.body.outcome for a in answers] == [PushOutcome.DUPLICATE]
            np.testing.assert_array_equal(into["b"], model["b"] - LR)  # counted once
            np.testing.assert_array_equal(into["a"], model["a"] - LR)
        finally:
            client.close()
