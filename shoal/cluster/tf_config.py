"""`parse_tf_config`: read TensorFlow's TF_CONFIG JSON into a `ClusterConfig`.

The format is TensorFlow's: {"cluster": {job: [addresses] or {index: address}},
"task": {"type": job, "index": i}}; "environment" and "rpc_layer" are accepted and
ignored. The caller reads the environment variable; this module does no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from shoal.cluster.config import ClusterConfig, check_task
from shoal.cluster.errors import ClusterError
from shoal.cluster.spec import ClusterSpec
from shoal.cluster.task import TaskId, check_index, normalize_job

EXAMPLE = (
    '{"cluster": {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}, "task": {"type": "worker", "index": 0}}'
)
_FIX = f"set it to e.g. '{EXAMPLE}'"


def parse_tf_config(text: str) -> ClusterConfig:
    """Parse a TF_CONFIG string; raise ClusterError saying what is wrong and how to fix it.

    A missing task.index means 0 (as tf.estimator did); a digit string such as "1" is
    read as an int. A task of type 'evaluator' need not be listed in the cluster.
    """
    if not isinstance(text, str) or not text.strip():
        raise ClusterError(f"TF_CONFIG {text!r} is empty; {_FIX}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(
            f"TF_CONFIG is not valid JSON ({e.msg}: line {e.lineno} column {e.colno}); {_FIX}"
        ) from e
    if not isinstance(data, Mapping):
        raise ClusterError(f"TF_CONFIG {text!r} is not a JSON object; {_FIX}")
    for key in ("cluster", "task"):
        if key not in data:
            raise ClusterError(f"TF_CONFIG has no {key!r} key (keys: {sorted(data)}); {_FIX}")
    cluster = ClusterSpec.from_dict(data["cluster"])
    task = _parse_task(data["task"])
    check_task(
        cluster,
        task,
        job_label="TF_CONFIG task.type",
        index_label="TF_CONFIG task.index",
        hosts_label=lambda job: f"cluster.{job}",
    )
    return ClusterConfig(cluster, task)


def _parse_task(task: object) -> TaskId:
    if not isinstance(task, Mapping):
        raise ClusterError(
            f"TF_CONFIG task {task!r} is not an object; write it as"
            ' {"type": "worker", "index": 0}'
        )
    if "type" not in task:
        raise ClusterError(
            f"TF_CONFIG task {dict(task)!r} has no 'type'; add e.g. \"type\": \"worker\""
        )
    job_type = task["type"]
    if not isinstance(job_type, str):
        raise ClusterError(
            f"TF_CONFIG task.type {job_type!r} is not a string; use a job name such as"
            ' "worker"'
        )
    job = normalize_job(job_type, "TF_CONFIG task.type")
    index = check_index(task.get("index", 0), "TF_CONFIG task.index")
    return TaskId(job, index)
