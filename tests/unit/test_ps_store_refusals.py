"""A ps holds only variables an update rule can update, and a refused init or push changes none of
them: an int counter beside a float weight was created, then every push failed after the weight
had already been updated (and the step was never counted)."""

import numpy as np
import pytest

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.ps.errors import PsError
from shoal.ps.optimizers import SGD
from shoal.ps.store import ShardStore
from shoal.train.errors import TrainError
from shoal.train.session import TrainingSession
from shoal.wire import JobSecret


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.bool_])
def test_a_variable_that_is_not_floating_point_is_refused_at_init_and_nothing_is_created(dtype):
    store = ShardStore("ps:0")
    with pytest.raises(PsError, match=f"variable 'count' is {np.dtype(dtype)}: .* must be floating point"):
        store.create({"w": np.zeros(4, np.float32), "count": np.zeros(1, dtype)}, SGD(0.5))
    assert len(store) == 0


def test_a_push_refused_for_one_shard_changes_no_shard():
    store = ShardStore("ps:0")
    store.create({"a": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}, SGD(0.5))
    with pytest.raises(PsError, match="variable 'b' on ps:0 is float32\\[2\\], but a worker sent float32\\[3\\]"):
        store.apply({"a": np.ones(4, np.float32), "b": np.ones(3, np.float32)})
    assert not store.values(["a"])["a"].any()  # 'a' comes first, and is untouched
    store.apply({"a": np.ones(4, np.float32), "b": np.ones(2, np.float32)})
    assert (store.values(["a"])["a"] == -0.5).all()


def test_a_session_refuses_variables_that_are_not_floating_point_naming_them():
    config = ClusterConfig(ClusterSpec.from_dict({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}),
                           TaskId("worker", 0))
    with pytest.raises(TrainError, match=r"variables 'b' \(int64\) are not floating point.*not \[0\] \* 10"):
        TrainingSession(config, {"w": np.zeros(3, np.float32), "b": [0, 0]}, SGD(0.1),
                        secret=JobSecret(b"s" * 32, "test"))
