"""`ClusterConfig`: the cluster plus which task this process is, and what follows from it.

Built once at the edge (from TF_CONFIG or flags) and passed inward. Pure data, no I/O;
immutable and thread-safe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Optional

from shoal.cluster.errors import ClusterError
from shoal.cluster.spec import ClusterSpec, describe_indices
from shoal.cluster.task import TaskId
from shoal.wording import counted

HostsLabel = Callable[[str], str]
"""Maps a job to where its hosts are listed in the user's input (for error messages)."""


def _cluster_field(job: str) -> str:
    return f"cluster.{job}"


def check_task(
    cluster: ClusterSpec,
    task: TaskId,
    *,
    job_label: str = "task job",
    index_label: str = "task index",
    hosts_label: HostsLabel = _cluster_field,
) -> None:
    """Raise ClusterError unless `task` is a task of `cluster`.

    An evaluator may stand outside the cluster (as in TensorFlow's TF_CONFIG), but then
    only as index 0. The labels let each input source name its own fields in the message.
    """
    if task.job == "evaluator" and task.job not in cluster.jobs:
        if task.index != 0:
            raise ClusterError(
                f"{index_label} {task.index} is invalid for an evaluator outside the cluster"
                f" (only index 0 is); set {index_label} to 0 or list the evaluators in"
                f" {hosts_label('evaluator')}"
            )
        return
    if task.job not in cluster.jobs:
        raise ClusterError(
            f"{job_label} {task.job!r} has no tasks in the cluster (jobs present:"
            f" {', '.join(cluster.jobs) or 'none'}); fix {job_label} or add tasks to"
            f" {hosts_label(task.job)}"
        )
    indices = cluster.task_indices(task.job)
    if task.index not in indices:
        raise ClusterError(
            f"{index_label} {task.index} is out of range for job {task.job!r} with"
            f" {counted(len(indices), 'task')} (valid: {describe_indices(indices)});"
            f" fix {index_label}"
            f" or add tasks to {hosts_label(task.job)}"
        )


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster and the task this process runs as; the task must belong to the cluster.

    The chief is chief:0 if the cluster has a chief job, else worker:0 (TensorFlow's
    rule). Training replicas are the chief and the workers, chief first.
    """

    cluster: ClusterSpec
    task: TaskId

    def __post_init__(self) -> None:
        check_task(self.cluster, self.task)

    @cached_property
    def chief_task(self) -> Optional[TaskId]:
        """chief:0 if there is a chief job, else worker:0 if it exists, else None. Worked out
        once (the config is immutable; a training loop may ask every step)."""
        if "chief" in self.cluster.jobs:
            return TaskId("chief", 0)
        if 0 in self.cluster.task_indices("worker"):
            return TaskId("worker", 0)
        return None

    @cached_property
    def is_chief(self) -> bool:
        """Whether this task is the chief (see `chief_task`); worked out once."""
        return self.task == self.chief_task

    @property
    def replica_tasks(self) -> tuple[TaskId, ...]:
        """The training replicas in order: chief tasks first, then workers by index."""
        return tuple(
            TaskId(job, index)
            for job in ("chief", "worker")
            for index in self.cluster.task_indices(job)
        )

    @property
    def num_replicas(self) -> int:
        """Number of training replicas (chief plus workers)."""
        return len(self.replica_tasks)

    @property
    def replica_index(self) -> int:
        """Position of this task in `replica_tasks`; ClusterError for ps and evaluator."""
        replicas = self.replica_tasks
        if self.task not in replicas:
            raise ClusterError(
                f"task {self.task} is not a training replica (only chief and worker tasks"
                " are); ask for replica_index only on chief or worker tasks"
            )
        return replicas.index(self.task)

    @property
    def ps_addresses(self) -> list[str]:
        """Addresses of the parameter servers, ordered by index."""
        return self.cluster.job_tasks("ps")

    @property
    def num_ps(self) -> int:
        """Number of parameter servers."""
        return self.cluster.num_tasks("ps")

    def to_tf_config_dict(self) -> dict[str, Any]:
        """The TF_CONFIG dict: {"cluster": ..., "task": {"type": job, "index": i}}."""
        return {
            "cluster": self.cluster.as_dict(),
            "task": {"type": self.task.job, "index": self.task.index},
        }

    def to_tf_config(self) -> str:
        """The TF_CONFIG JSON string; `parse_tf_config` reads it back to an equal config."""
        return json.dumps(self.to_tf_config_dict())
