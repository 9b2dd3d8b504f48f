"""Unit tests of shoal.cluster: TaskId, ClusterSpec and ClusterConfig."""

import pytest

from shoal.cluster import JOBS, ClusterConfig, ClusterError, ClusterSpec, TaskId

TF_DOC_CLUSTER = {
    "chief": ["host0:2222"],
    "worker": ["host1:2222", "host2:2222"],
    "ps": ["host3:2222"],
}


def config(cluster, job, index):
    return ClusterConfig(ClusterSpec.from_dict(cluster), TaskId(job, index))


# --- TaskId -----------------------------------------------------------------------------


def test_task_id_str_formats_job_colon_index():
    assert str(TaskId("worker", 1)) == "worker:1"


def test_task_id_parse_round_trips_str():
    assert TaskId.parse("worker:1") == TaskId("worker", 1)
    assert TaskId.parse(str(TaskId("ps", 3))) == TaskId("ps", 3)


def test_task_id_parse_normalizes_master():
    assert TaskId.parse("master:0") == TaskId("chief", 0)


@pytest.mark.parametrize("text", ["worker", "worker:x", "worker:-1", ":1", "worker:1:2"])
def test_task_id_parse_rejects_malformed_text(text):
    with pytest.raises(ClusterError, match="job:index") as e:
        TaskId.parse(text)
    assert repr(text) in str(e.value)


def test_task_id_rejects_unknown_job():
    with pytest.raises(ClusterError, match="wroker") as e:
        TaskId("wroker", 0)
    assert "did you mean 'worker'" in str(e.value)


def test_task_id_rejects_negative_index():
    with pytest.raises(ClusterError, match="-1"):
        TaskId("worker", -1)


# --- ClusterSpec construction -----------------------------------------------------------


def test_spec_from_dict_dense_round_trips_as_dict():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    assert spec.as_dict() == TF_DOC_CLUSTER


def test_spec_from_dict_sparse_string_keys_round_trip_as_int_dict():
    spec = ClusterSpec.from_dict({"worker": {"1": "host1:2222"}})
    assert spec.as_dict() == {"worker": {1: "host1:2222"}}
    assert spec.task_indices("worker") == (1,)


def test_spec_from_dict_sparse_dict_that_is_dense_becomes_list():
    spec = ClusterSpec.from_dict({"worker": {1: "b:1", 0: "a:1"}})
    assert spec.as_dict() == {"worker": ["a:1", "b:1"]}


def test_spec_from_dict_master_becomes_chief():
    spec = ClusterSpec.from_dict({"master": ["host0:2222"], "worker": ["host1:2222"]})
    assert spec.jobs == ("chief", "worker")
    assert spec.as_dict() == {"chief": ["host0:2222"], "worker": ["host1:2222"]}


def test_spec_from_dict_drops_empty_jobs():
    spec = ClusterSpec.from_dict({"worker": ["a:1"], "ps": [], "evaluator": {}})
    assert spec.jobs == ("worker",)
    assert spec.as_dict() == {"worker": ["a:1"]}


def test_spec_jobs_follow_jobs_order_not_input_order():
    spec = ClusterSpec.from_dict({"ps": ["p:1"], "worker": ["w:1"], "chief": ["c:1"]})
    assert spec.jobs == ("chief", "worker", "ps")
    assert set(spec.jobs) <= set(JOBS)


def test_spec_from_dict_accepts_a_spec():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    assert ClusterSpec.from_dict(spec) is spec


def test_spec_equal_values_are_equal_and_hash_equal():
    a = ClusterSpec.from_dict({"worker": ["a:1", "b:1"], "ps": ["c:1"]})
    b = ClusterSpec.from_dict({"ps": ("c:1",), "worker": {"0": "a:1", "1": "b:1"}})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_spec_different_values_are_not_equal():
    a = ClusterSpec.from_dict({"worker": ["a:1", "b:1"]})
    assert a != ClusterSpec.from_dict({"worker": ["b:1", "a:1"]})


def test_spec_repr_shows_the_dict():
    assert "host1:2222" in repr(ClusterSpec.from_dict({"worker": ["host1:2222"]}))


# --- ClusterSpec queries ----------------------------------------------------------------


def test_spec_num_tasks_counts_tasks_and_is_zero_when_absent():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    assert spec.num_tasks("worker") == 2
    assert spec.num_tasks("evaluator") == 0


def test_spec_queries_accept_master_alias():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    assert spec.num_tasks("master") == 1
    assert spec.task_address("master", 0) == "host0:2222"


def test_spec_queries_reject_unknown_job():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    with pytest.raises(ClusterError, match="wrker"):
        spec.num_tasks("wrker")


def test_spec_task_address_returns_address():
    spec = ClusterSpec.from_dict({"worker": {"3": "h:3", "1": "h:1"}})
    assert spec.task_address("worker", 3) == "h:3"


def test_spec_task_address_raises_for_missing_index():
    spec = ClusterSpec.from_dict({"worker": {"3": "h:3", "1": "h:1"}})
    with pytest.raises(ClusterError, match="worker:2") as e:
        spec.task_address("worker", 2)
    assert "1, 3" in str(e.value)


def test_spec_task_address_raises_for_absent_job():
    spec = ClusterSpec.from_dict({"worker": ["a:1"]})
    with pytest.raises(ClusterError, match="ps:0"):
        spec.task_address("ps", 0)


def test_spec_job_tasks_orders_by_index_when_sparse():
    spec = ClusterSpec.from_dict({"worker": {"5": "e:1", "2": "b:1"}})
    assert spec.job_tasks("worker") == ["b:1", "e:1"]
    assert spec.job_tasks("ps") == []


def test_spec_tasks_lists_all_tasks_in_jobs_order():
    spec = ClusterSpec.from_dict(TF_DOC_CLUSTER)
    assert [str(t) for t in spec.tasks()] == ["chief:0", "worker:0", "worker:1", "ps:0"]


# --- ClusterSpec validation -------------------------------------------------------------


def test_spec_rejects_unknown_job_listing_jobs():
    with pytest.raises(ClusterError, match="'workers'") as e:
        ClusterSpec.from_dict({"workers": ["a:1"]})
    assert "chief, worker, ps, evaluator" in str(e.value)


def test_spec_rejects_chief_and_master_together():
    with pytest.raises(ClusterError, match="master"):
        ClusterSpec.from_dict({"chief": ["a:1"], "master": ["b:1"]})


def test_spec_rejects_two_chiefs():
    with pytest.raises(ClusterError, match="b:1"):
        ClusterSpec.from_dict({"chief": ["a:1", "b:1"]})


def test_spec_rejects_chief_at_nonzero_index():
    with pytest.raises(ClusterError, match=r"\[1\]"):
        ClusterSpec.from_dict({"chief": {"1": "a:1"}})


@pytest.mark.parametrize(
    "address",
    ["host1", ":2222", "host1:", "host1:http", "host1:65536", "host1:-1", "::1:2222",
     "[::zz]:2222", "bad host:1", "300.1.1.1:1", "a..b:1", "-a:1"],
)
def test_spec_rejects_bad_address_naming_where(address):
    with pytest.raises(ClusterError) as e:
        ClusterSpec.from_dict({"worker": ["ok:1", address]})
    assert f"cluster.worker[1] = {address!r}" in str(e.value)


def test_spec_rejects_non_string_address():
    with pytest.raises(ClusterError, match=r"cluster.ps\[0\] = 2222"):
        ClusterSpec.from_dict({"ps": [2222]})


@pytest.mark.parametrize(
    "address",
    ["localhost:2222", "127.0.0.1:0", "[::1]:2222", "[fe80::1]:65535", "node-1.example.com:80",
     "my_host:1"],
)
def test_spec_accepts_valid_address(address):
    assert ClusterSpec.from_dict({"worker": [address]}).job_tasks("worker") == [address]


def test_spec_rejects_duplicate_address_across_jobs():
    with pytest.raises(ClusterError, match="h:2222") as e:
        ClusterSpec.from_dict({"worker": ["h:2222"], "ps": ["h:2222"]})
    assert "cluster.ps[0]" in str(e.value) and "cluster.worker[0]" in str(e.value)


def test_spec_allows_repeated_port_zero():
    spec = ClusterSpec.from_dict({"worker": ["localhost:0", "localhost:0"]})
    assert spec.num_tasks("worker") == 2


def test_spec_rejects_job_given_as_string():
    with pytest.raises(ClusterError, match="'h:1'"):
        ClusterSpec.from_dict({"worker": "h:1"})


def test_spec_rejects_non_numeric_sparse_key():
    with pytest.raises(ClusterError, match="'one'"):
        ClusterSpec.from_dict({"worker": {"one": "h:1"}})


def test_spec_rejects_sparse_key_given_twice():
    with pytest.raises(ClusterError, match="same index"):
        ClusterSpec.from_dict({"worker": {"1": "a:1", 1: "b:1"}})


def test_spec_rejects_non_mapping():
    with pytest.raises(ClusterError, match="not a mapping"):
        ClusterSpec.from_dict(["a:1"])


def test_spec_direct_construction_is_validated():
    with pytest.raises(ClusterError, match="order"):
        ClusterSpec((("ps", ((0, "a:1"),)), ("worker", ((0, "b:1"),))))


# --- ClusterConfig ----------------------------------------------------------------------


def test_config_is_chief_true_for_chief_when_chief_job_exists():
    assert config(TF_DOC_CLUSTER, "chief", 0).is_chief
    assert not config(TF_DOC_CLUSTER, "worker", 0).is_chief


def test_config_stays_equal_and_hashable_after_chief_is_read():
    read, fresh = config(TF_DOC_CLUSTER, "worker", 0), config(TF_DOC_CLUSTER, "worker", 0)
    assert read.chief_task == TaskId("chief", 0) and not read.is_chief
    assert read == fresh and hash(read) == hash(fresh)
    assert {read: 1}[fresh] == 1


def test_config_is_chief_true_for_worker_zero_without_chief_job():
    cluster = {"worker": ["a:1", "b:1"], "ps": ["c:1"]}
    assert config(cluster, "worker", 0).is_chief
    assert not config(cluster, "worker", 1).is_chief
    assert not config(cluster, "ps", 0).is_chief


def test_config_chief_task_is_none_without_chief_or_worker_zero():
    cfg = config({"worker": {"1": "a:1"}}, "worker", 1)
    assert cfg.chief_task is None
    assert not cfg.is_chief


def test_config_chief_task_names_chief_or_worker_zero():
    assert config(TF_DOC_CLUSTER, "ps", 0).chief_task == TaskId("chief", 0)
    assert config({"worker": ["a:1"]}, "worker", 0).chief_task == TaskId("worker", 0)


def test_config_replica_tasks_put_chief_first_then_workers_by_index():
    cfg = config({"worker": {"2": "w2:1", "0": "w0:1"}, "chief": ["c:1"], "ps": ["p:1"]},
                 "worker", 2)
    assert [str(t) for t in cfg.replica_tasks] == ["chief:0", "worker:0", "worker:2"]
    assert cfg.num_replicas == 3
    assert cfg.replica_index == 2


def test_config_replica_index_of_chief_is_zero():
    assert config(TF_DOC_CLUSTER, "chief", 0).replica_index == 0
    assert config(TF_DOC_CLUSTER, "worker", 0).replica_index == 1


def test_config_replica_index_raises_for_ps():
    with pytest.raises(ClusterError, match="ps:0"):
        config(TF_DOC_CLUSTER, "ps", 0).replica_index


def test_config_ps_addresses_are_ordered_by_index():
    cfg = config({"worker": ["w:1"], "ps": {"1": "p1:1", "0": "p0:1"}}, "ps", 1)
    assert cfg.ps_addresses == ["p0:1", "p1:1"]
    assert cfg.num_ps == 2


def test_config_rejects_task_of_absent_job():
    with pytest.raises(ClusterError, match="'ps'") as e:
        config({"worker": ["a:1"]}, "ps", 0)
    assert "cluster.ps" in str(e.value)


def test_config_rejects_index_out_of_range_naming_valid_indices():
    with pytest.raises(ClusterError, match="index 3") as e:
        config({"worker": ["a:1", "b:1"]}, "worker", 3)
    assert "valid: 0..1" in str(e.value)


def test_config_allows_evaluator_outside_cluster():
    cfg = config({"worker": ["a:1"]}, "evaluator", 0)
    assert not cfg.is_chief
    assert cfg.task == TaskId("evaluator", 0)


def test_config_rejects_evaluator_outside_cluster_with_nonzero_index():
    with pytest.raises(ClusterError, match="index 1"):
        config({"worker": ["a:1"]}, "evaluator", 1)


def test_config_is_hashable_and_equal_by_value():
    assert config(TF_DOC_CLUSTER, "ps", 0) == config(dict(TF_DOC_CLUSTER), "ps", 0)
    assert hash(config(TF_DOC_CLUSTER, "ps", 0)) == hash(config(TF_DOC_CLUSTER, "ps", 0))


def test_config_to_tf_config_dict_has_cluster_and_task():
    assert config(TF_DOC_CLUSTER, "worker", 1).to_tf_config_dict() == {
        "cluster": TF_DOC_CLUSTER,
        "task": {"type": "worker", "index": 1},
    }
