"""Unit tests of parse_tf_config and the TF_CONFIG round trip."""

import json

import pytest

from shoal.cluster import ClusterConfig, ClusterError, ClusterSpec, TaskId, parse_tf_config

# The example from TensorFlow's distributed training docs.
TF_DOC = {
    "cluster": {
        "chief": ["host0:2222"],
        "worker": ["host1:2222", "host2:2222"],
        "ps": ["host3:2222"],
    },
    "task": {"type": "worker", "index": 1},
}


def tf_config(cluster, task_type="worker", index=0, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


def test_parse_reads_tf_documented_example():
    cfg = parse_tf_config(json.dumps(TF_DOC))
    assert cfg.task == TaskId("worker", 1)
    assert cfg.cluster.as_dict() == TF_DOC["cluster"]
    assert not cfg.is_chief
    assert cfg.replica_index == 2
    assert cfg.ps_addresses == ["host3:2222"]


def test_parse_reads_tf1_master_form():
    text = tf_config({"master": ["host0:2222"], "worker": ["host1:2222"], "ps": ["host2:2222"]},
                     "master", 0)
    cfg = parse_tf_config(text)
    assert cfg.task == TaskId("chief", 0)
    assert cfg.is_chief
    assert cfg.cluster.jobs == ("chief", "worker", "ps")


def test_parse_reads_sparse_cluster():
    cfg = parse_tf_config(tf_config({"worker": {"1": "host1:2222"}, "ps": ["host3:2222"]},
                                    "worker", 1))
    assert cfg.cluster.task_address("worker", 1) == "host1:2222"
    assert cfg.chief_task is None


def test_parse_reads_evaluator_absent_from_cluster():
    cfg = parse_tf_config(tf_config(TF_DOC["cluster"], "evaluator", 0))
    assert cfg.task == TaskId("evaluator", 0)
    assert "evaluator" not in cfg.cluster.jobs
    assert not cfg.is_chief


def test_parse_reads_evaluator_listed_in_cluster():
    cfg = parse_tf_config(tf_config({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0))
    assert cfg.cluster.task_address("evaluator", 0) == "e:1"


def test_parse_ignores_environment_and_rpc_layer():
    text = tf_config({"worker": ["a:1"]}, environment="cloud", rpc_layer="grpc")
    assert parse_tf_config(text) == parse_tf_config(tf_config({"worker": ["a:1"]}))


def test_parse_accepts_numeric_string_index():
    assert parse_tf_config(tf_config(TF_DOC["cluster"], "worker", "1")).task.index == 1


def test_parse_defaults_missing_index_to_zero():
    text = json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})
    assert parse_tf_config(text).task == TaskId("worker", 0)


def test_round_trip_to_tf_config_then_parse_is_equal():
    for text in [json.dumps(TF_DOC), tf_config({"worker": {"1": "h:1", "4": "h:4"}}, "worker", 4),
                 tf_config({"worker": ["a:1"]}, "evaluator", 0)]:
        cfg = parse_tf_config(text)
        assert parse_tf_config(cfg.to_tf_config()) == cfg


def test_round_trip_to_tf_config_emits_tf_shape():
    cfg = ClusterConfig(ClusterSpec.from_dict(TF_DOC["cluster"]), TaskId("worker", 1))
    assert json.loads(cfg.to_tf_config()) == TF_DOC


def test_parse_rejects_invalid_json_quoting_position():
    with pytest.raises(ClusterError) as e:
        parse_tf_config('{"cluster": {} "task": {}}')
    msg = str(e.value)
    assert "not valid JSON (Expecting ',' delimiter: line 1 column 16)" in msg
    assert '"task": {"type": "worker", "index": 0}' in msg


def test_parse_rejects_empty_text():
    with pytest.raises(ClusterError, match="empty"):
        parse_tf_config("  ")


def test_parse_rejects_non_object_json():
    with pytest.raises(ClusterError, match=r"\[1, 2\]"):
        parse_tf_config("[1, 2]")


def test_parse_rejects_missing_cluster():
    with pytest.raises(ClusterError, match="'cluster'"):
        parse_tf_config(json.dumps({"task": {"type": "worker", "index": 0}}))


def test_parse_rejects_missing_task():
    with pytest.raises(ClusterError, match="'task'"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["a:1"]}}))


def test_parse_rejects_task_not_an_object():
    with pytest.raises(ClusterError, match="'worker:0'"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["a:1"]}, "task": "worker:0"}))


def test_parse_rejects_missing_task_type():
    with pytest.raises(ClusterError, match="no 'type'"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}))


def test_parse_rejects_non_string_task_type():
    with pytest.raises(ClusterError, match="task.type 7 is not a string"):
        parse_tf_config(tf_config({"worker": ["a:1"]}, 7, 0))


def test_parse_rejects_unknown_task_type():
    with pytest.raises(ClusterError, match="task.type 'wroker'"):
        parse_tf_config(tf_config({"worker": ["a:1"]}, "wroker", 0))


@pytest.mark.parametrize("index", [1.5, "one", True, None, [0]])
def test_parse_rejects_non_int_task_index(index):
    with pytest.raises(ClusterError, match="task.index") as e:
        parse_tf_config(tf_config({"worker": ["a:1", "b:1"]}, "worker", index))
    assert repr(index) in str(e.value)


def test_parse_rejects_negative_task_index():
    with pytest.raises(ClusterError, match="task.index -1"):
        parse_tf_config(tf_config({"worker": ["a:1"]}, "worker", -1))


def test_parse_rejects_index_out_of_range_naming_valid_range():
    with pytest.raises(ClusterError) as e:
        parse_tf_config(tf_config({"worker": ["a:1", "b:1"]}, "worker", 3))
    assert str(e.value).startswith(
        "TF_CONFIG task.index 3 is out of range for job 'worker' with 2 tasks (valid: 0..1)"
    )
    assert "cluster.worker" in str(e.value)


def test_parse_rejects_task_type_absent_from_cluster():
    with pytest.raises(ClusterError, match="task.type 'ps'"):
        parse_tf_config(tf_config({"worker": ["a:1"]}, "ps", 0))


def test_parse_rejects_bad_address_naming_cluster_field():
    with pytest.raises(ClusterError, match=r"cluster.ps\[0\] = 'host3'"):
        parse_tf_config(tf_config({"worker": ["a:1"], "ps": ["host3"]}))


def test_parse_rejects_unknown_cluster_job():
    with pytest.raises(ClusterError, match="'parameter_server'"):
        parse_tf_config(tf_config({"worker": ["a:1"], "parameter_server": ["b:1"]}))


def test_parse_rejects_two_chiefs():
    with pytest.raises(ClusterError, match="one chief"):
        parse_tf_config(tf_config({"chief": ["a:1", "b:1"], "worker": ["c:1"]}))
