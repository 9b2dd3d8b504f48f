"""`ClusterSpec`: which address each task of each job listens on.

Compatible with TensorFlow's `tf.train.ClusterSpec` as a dict: job name -> list of
"host:port" (dense), or job name -> {index: "host:port"} (sparse). Pure data, no I/O;
instances are immutable, hashable and thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from shoal.cluster.address import split_address
from shoal.cluster.errors import ClusterError
from shoal.cluster.task import JOBS, TaskId, check_index, normalize_job

JobTasks = tuple[tuple[int, str], ...]
"""One job's tasks: (index, address) pairs sorted by index."""

ClusterDict = dict[str, Union[list[str], dict[int, str]]]


@dataclass(frozen=True)
class ClusterSpec:
    """Job name -> {task index: "host:port"}, validated on construction.

    `entries` holds (job, ((index, address), ...)) pairs in JOBS order with indices
    sorted; build one with `ClusterSpec.from_dict`. Rules: jobs are from JOBS, at most one
    chief (index 0), addresses are host:port, no two tasks share an address (port 0,
    "pick any free port", may repeat), and jobs without tasks are left out.
    """

    entries: tuple[tuple[str, JobTasks], ...] = ()

    def __post_init__(self) -> None:
        order = [job for job, _ in self.entries]
        if order != [job for job in JOBS if job in order]:
            raise ClusterError(
                f"ClusterSpec jobs {order} must be distinct and in the order {list(JOBS)};"
                " build it with ClusterSpec.from_dict"
            )
        seen: dict[tuple[str, int], str] = {}
        for job, tasks in self.entries:
            if not tasks:
                raise ClusterError(f"ClusterSpec job {job!r} has no tasks; leave it out")
            indices = [index for index, _ in tasks]
            if indices != sorted(set(indices)):
                raise ClusterError(
                    f"ClusterSpec job {job!r} indices {indices} must be distinct and sorted;"
                    " build it with ClusterSpec.from_dict"
                )
            if job == "chief" and indices != [0]:
                raise ClusterError(
                    f"cluster.chief has tasks {indices} but a cluster has one chief, chief:0;"
                    " list a single chief address (other tasks belong in cluster.worker)"
                )
            for index, address in tasks:
                where = f"cluster.{job}[{index}]"
                check_index(index, f"{where} index")
                host, port = split_address(address, where)
                key = (host.lower(), port)
                if port != 0 and key in seen:
                    raise ClusterError(
                        f"{where} = {address!r} is the same address as {seen[key]};"
                        " give each task its own host:port (or port 0 for any free port)"
                    )
                seen[key] = where

    @classmethod
    def from_dict(cls, cluster: Any) -> "ClusterSpec":
        """Build a ClusterSpec from a TF-style dict (or return `cluster` if it is one).

        Each job maps to a list of addresses (task i is item i) or to a dict
        {index: address} whose keys are ints or digit strings (the JSON form). 'master'
        is read as 'chief'. Raises ClusterError naming the bad job, index or address.
        """
        if isinstance(cluster, ClusterSpec):
            return cluster
        if not isinstance(cluster, Mapping):
            raise ClusterError(
                f"cluster {cluster!r} is not a mapping; write it as"
                " {'worker': ['host1:2222', 'host2:2222'], 'ps': ['host3:2222']}"
            )
        if "chief" in cluster and "master" in cluster:
            raise ClusterError(
                f"cluster has both 'chief' {cluster['chief']!r} and 'master'"
                f" {cluster['master']!r} ('master' is the TF1 name of chief); keep only"
                " 'chief': a cluster has one chief"
            )
        jobs: dict[str, JobTasks] = {}
        for name, tasks in cluster.items():
            job = normalize_job(name, "cluster job")
            parsed = _job_tasks(job, tasks)
            if parsed:
                jobs[job] = parsed
        return cls(tuple((job, jobs[job]) for job in JOBS if job in jobs))

    def as_dict(self) -> ClusterDict:
        """Return the TF-style dict: dense jobs as lists, sparse jobs as {int: address}."""
        out: ClusterDict = {}
        for job, tasks in self.entries:
            if [index for index, _ in tasks] == list(range(len(tasks))):
                out[job] = [address for _, address in tasks]
            else:
                out[job] = dict(tasks)
        return out

    @property
    def jobs(self) -> tuple[str, ...]:
        """The jobs that have at least one task, in JOBS order."""
        return tuple(job for job, _ in self.entries)

    def num_tasks(self, job: str) -> int:
        """Number of tasks of `job`, 0 if the cluster has none."""
        return len(self._tasks_of(job))

    def task_indices(self, job: str) -> tuple[int, ...]:
        """The task indices of `job` in increasing order (empty if absent)."""
        return tuple(index for index, _ in self._tasks_of(job))

    def task_address(self, job: str, index: int) -> str:
        """The address of task `index` of `job`; ClusterError if there is no such task."""
        tasks = dict(self._tasks_of(job))
        if index not in tasks:
            job = normalize_job(job, "job")
            raise ClusterError(
                f"cluster has no task {job}:{index} (indices of {job!r}:"
                f" {describe_indices(tuple(tasks))}); use one of those or add it to"
                f" cluster.{job}"
            )
        return tasks[index]

    def job_tasks(self, job: str) -> list[str]:
        """The addresses of `job`'s tasks ordered by index (empty if absent).

        Unlike TensorFlow, gaps of a sparse job are skipped rather than filled with None.
        """
        return [address for _, address in self._tasks_of(job)]

    def tasks(self) -> tuple[TaskId, ...]:
        """Every task of the cluster, in JOBS order, then by index."""
        return tuple(TaskId(job, index) for job, tasks in self.entries for index, _ in tasks)

    def __repr__(self) -> str:
        return f"ClusterSpec.from_dict({self.as_dict()!r})"

    def _tasks_of(self, job: str) -> JobTasks:
        job = normalize_job(job, "job")
        for name, tasks in self.entries:
            if name == job:
                return tasks
        return ()


def describe_indices(indices: tuple[int, ...]) -> str:
    """Say which indices are valid: "0..2", "1, 3" or "none"."""
    if not indices:
        return "none"
    if list(indices) == list(range(len(indices))):
        return f"0..{len(indices) - 1}"
    return ", ".join(str(index) for index in indices)


def _job_tasks(job: str, tasks: Any) -> JobTasks:
    if isinstance(tasks, (list, tuple)):
        pairs = list(enumerate(tasks))
    elif isinstance(tasks, Mapping):
        pairs = [(check_index(key, f"cluster.{job} key"), addr) for key, addr in tasks.items()]
        indices = [index for index, _ in pairs]
        if len(set(indices)) != len(indices):
            raise ClusterError(
                f"cluster.{job} lists the same index twice in {dict(tasks)!r};"
                " give each task index once"
            )
    else:
        raise ClusterError(
            f"cluster.{job} = {tasks!r} is neither a list of addresses nor an"
            f" {{index: address}} dict; write it as e.g. ['host1:2222', 'host2:2222']"
        )
    if job == "chief" and len(pairs) > 1:
        raise ClusterError(
            f"cluster.chief has {len(pairs)} tasks {tasks!r} but a cluster has one chief;"
            " keep one chief address and move the others to cluster.worker"
        )
    return tuple(sorted(pairs))
