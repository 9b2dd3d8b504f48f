"""Unit tests of the cluster flags and resolve_cluster_config."""

import argparse
import json
import re

import pytest

from shoal.cluster import (
    ClusterError,
    TaskId,
    add_cluster_flags,
    config_from_flags,
    resolve_cluster_config,
)

TF_CONFIG = json.dumps(
    {"cluster": {"worker": ["tf0:1", "tf1:1"]}, "task": {"type": "worker", "index": 1}}
)


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_cluster_flags(parser)
    return parser.parse_args(list(argv))


def test_add_cluster_flags_defaults_make_absence_detectable():
    ns = parse()
    assert (ns.ps_hosts, ns.worker_hosts, ns.chief_host, ns.job_name) == (None,) * 4
    assert ns.task_index == 0


def test_config_from_flags_builds_seed_style_cluster():
    cfg = config_from_flags(parse("--ps_hosts=p0:2222,p1:2222", "--worker_hosts=w0:2222,w1:2222",
                                  "--job_name=worker", "--task_index=1"))
    assert cfg.cluster.as_dict() == {"worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222", "p1:2222"]}
    assert cfg.task == TaskId("worker", 1)
    assert not cfg.is_chief


def test_config_from_flags_reads_chief_host():
    cfg = config_from_flags(parse("--chief_host=c:1", "--worker_hosts=w:1", "--job_name=chief"))
    assert cfg.is_chief
    assert cfg.cluster.jobs == ("chief", "worker")


def test_config_from_flags_accepts_chief_without_workers():
    cfg = config_from_flags(parse("--chief_host=c:1", "--job_name=master"))
    assert cfg.task == TaskId("chief", 0)


def test_config_from_flags_strips_spaces_around_hosts():
    cfg = config_from_flags(parse("--worker_hosts= a:1 , b:1", "--job_name=worker"))
    assert cfg.cluster.job_tasks("worker") == ["a:1", "b:1"]


def test_config_from_flags_allows_evaluator_outside_cluster():
    cfg = config_from_flags(parse("--worker_hosts=w:1", "--job_name=evaluator"))
    assert cfg.task == TaskId("evaluator", 0)


def test_config_from_flags_rejects_missing_job_name():
    with pytest.raises(ClusterError, match="--job_name"):
        config_from_flags(parse("--worker_hosts=w:1"))


def test_config_from_flags_rejects_unknown_job_name():
    with pytest.raises(ClusterError) as e:
        config_from_flags(parse("--worker_hosts=w:1", "--job_name=wroker"))
    assert str(e.value).startswith("--job_name 'wroker' is not a job")
    assert "chief, worker, ps, evaluator" in str(e.value)


def test_config_from_flags_rejects_missing_worker_and_chief_hosts():
    with pytest.raises(ClusterError, match="--worker_hosts"):
        config_from_flags(parse("--ps_hosts=p:1", "--job_name=ps"))


def test_config_from_flags_rejects_bad_host_naming_flag():
    with pytest.raises(ClusterError, match="--ps_hosts entry 1 = 'p1'"):
        config_from_flags(parse("--ps_hosts=p0:1,p1", "--worker_hosts=w:1", "--job_name=ps"))


def test_config_from_flags_rejects_empty_host_entry():
    with pytest.raises(ClusterError, match="'w:1,,w:2'"):
        config_from_flags(parse("--worker_hosts=w:1,,w:2", "--job_name=worker"))


def test_config_from_flags_rejects_several_chief_hosts():
    with pytest.raises(ClusterError, match="'c:1,c:2'"):
        config_from_flags(parse("--chief_host=c:1,c:2", "--job_name=chief"))


def test_config_from_flags_rejects_duplicate_address():
    with pytest.raises(ClusterError, match="h:1"):
        config_from_flags(parse("--ps_hosts=h:1", "--worker_hosts=h:1", "--job_name=ps"))


def test_config_from_flags_rejects_task_index_out_of_range():
    with pytest.raises(ClusterError) as e:
        config_from_flags(parse("--worker_hosts=w:1,w:2", "--job_name=worker", "--task_index=2"))
    assert str(e.value).startswith("--task_index 2 is out of range for job 'worker'")
    assert "--worker_hosts" in str(e.value)


def test_config_from_flags_rejects_negative_task_index():
    with pytest.raises(ClusterError, match="--task_index -1"):
        config_from_flags(parse("--worker_hosts=w:1", "--job_name=worker", "--task_index=-1"))


def test_config_from_flags_rejects_job_without_hosts():
    with pytest.raises(ClusterError, match="--job_name 'ps'") as e:
        config_from_flags(parse("--worker_hosts=w:1", "--job_name=ps"))
    assert "--ps_hosts" in str(e.value)


def test_resolve_uses_flags_when_job_name_given():
    cfg = resolve_cluster_config(parse("--worker_hosts=w:1", "--job_name=worker"), {})
    assert cfg.cluster.job_tasks("worker") == ["w:1"]


def test_resolve_prefers_flags_over_tf_config():
    ns = parse("--worker_hosts=w:1", "--job_name=worker")
    cfg = resolve_cluster_config(ns, {"TF_CONFIG": TF_CONFIG})
    assert cfg.cluster.job_tasks("worker") == ["w:1"]


def test_resolve_uses_tf_config_without_flags():
    cfg = resolve_cluster_config(parse(), {"TF_CONFIG": TF_CONFIG})
    assert cfg.task == TaskId("worker", 1)


def test_resolve_uses_tf_config_without_namespace():
    assert resolve_cluster_config(None, {"TF_CONFIG": TF_CONFIG}).num_replicas == 2


def test_resolve_rejects_host_flags_without_job_name_even_with_tf_config():
    with pytest.raises(ClusterError, match="--job_name"):
        resolve_cluster_config(parse("--worker_hosts=w:1"), {"TF_CONFIG": TF_CONFIG})


def test_resolve_rejects_neither_flags_nor_tf_config():
    with pytest.raises(ClusterError) as e:
        resolve_cluster_config(parse(), {"TF_CONFIG": ""})
    assert "TF_CONFIG" in str(e.value) and "--job_name" in str(e.value) and "shoal run --ps 1" in str(e.value)
    example = re.search(r"e\.g\. '([^']+)'", str(e.value)).group(1)  # the TF_CONFIG it suggests works
    assert resolve_cluster_config(parse(), {"TF_CONFIG": example}).cluster.job_tasks("ps") == ["localhost:2222"]


def test_resolve_passes_tf_config_errors_through():
    with pytest.raises(ClusterError, match="not valid JSON"):
        resolve_cluster_config(None, {"TF_CONFIG": "{oops"})
