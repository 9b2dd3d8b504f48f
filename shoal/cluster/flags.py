"""The classic seed-style cluster flags: --ps_hosts, --worker_hosts, --chief_host,
--job_name, --task_index, and `config_from_flags` that turns them into a `ClusterConfig`.

Pure parsing, no I/O; thread-safe.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from shoal.cluster.address import split_address
from shoal.cluster.config import ClusterConfig, check_task
from shoal.cluster.errors import ClusterError
from shoal.cluster.spec import ClusterSpec
from shoal.cluster.task import TaskId, check_index, normalize_job

HOST_FLAGS = {"chief": "--chief_host", "worker": "--worker_hosts", "ps": "--ps_hosts"}
"""The flag that lists each job's addresses (evaluators have none: use TF_CONFIG)."""

CLUSTER_FLAG_DESTS = ("job_name", "ps_hosts", "worker_hosts", "chief_host")
"""Namespace attributes whose presence means "the cluster comes from flags"."""


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Add the cluster flags to `parser`; all default to None except --task_index (0)."""
    group = parser.add_argument_group("cluster (instead of TF_CONFIG)")
    group.add_argument("--ps_hosts", default=None, help="comma-separated host:port of the ps tasks")
    group.add_argument(
        "--worker_hosts", default=None, help="comma-separated host:port of the worker tasks"
    )
    group.add_argument("--chief_host", default=None, help="host:port of the chief, if any")
    group.add_argument("--job_name", default=None, help="this task's job: chief, worker, ps")
    group.add_argument("--task_index", type=int, default=0, help="this task's index in its job")


def config_from_flags(namespace: Any) -> ClusterConfig:
    """Build a ClusterConfig from parsed cluster flags; ClusterError names the bad flag.

    Needs --job_name and at least one of --worker_hosts / --chief_host.
    """
    job_name = getattr(namespace, "job_name", None)
    if not job_name:
        raise ClusterError(
            "--job_name is missing; pass --job_name (chief, worker or ps) with --task_index"
        )
    job = normalize_job(job_name, "--job_name")
    hosts = {
        job_: _split_hosts(getattr(namespace, dest, None), flag)
        for job_, flag, dest in (
            ("chief", "--chief_host", "chief_host"),
            ("worker", "--worker_hosts", "worker_hosts"),
            ("ps", "--ps_hosts", "ps_hosts"),
        )
    }
    if len(hosts["chief"]) > 1:
        raise ClusterError(
            f"--chief_host {getattr(namespace, 'chief_host')!r} lists {len(hosts['chief'])}"
            " addresses; give one chief and put the others in --worker_hosts"
        )
    if not hosts["worker"] and not hosts["chief"]:
        raise ClusterError(
            "--worker_hosts and --chief_host are both missing; pass e.g."
            " --worker_hosts=localhost:2222,localhost:2223"
        )
    try:
        cluster = ClusterSpec.from_dict(hosts)
    except ClusterError as e:
        raise ClusterError(f"the cluster flags describe a bad cluster: {e}") from e
    task = TaskId(job, check_index(getattr(namespace, "task_index", 0), "--task_index"))
    check_task(
        cluster,
        task,
        job_label="--job_name",
        index_label="--task_index",
        hosts_label=lambda j: HOST_FLAGS.get(j, f"TF_CONFIG cluster.{j} (no flag lists {j}s)"),
    )
    return ClusterConfig(cluster, task)


def _split_hosts(value: Optional[str], flag: str) -> list[str]:
    if value is None or not value.strip():
        return []
    items = [item.strip() for item in value.split(",")]
    for position, item in enumerate(items):
        if not item:
            raise ClusterError(
                f"{flag} {value!r} has an empty entry at position {position};"
                " remove the extra comma"
            )
        split_address(item, f"{flag} entry {position}")
    return items
