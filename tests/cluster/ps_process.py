"""Helpers for tests that talk to a real ps process from the test process itself."""

from __future__ import annotations

import time

import numpy as np

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.ps.protocol import StatusReply
from shoal.errors import ShoalError
from shoal.wire import JobSecret, RpcClient
from tests.cluster.harness import LocalCluster

PS_ONLY = ["-c", "import os, shoal; shoal.Server.for_task(shoal.resolve_cluster_config(None, os.environ), "
                 "secret=shoal.resolve_job_secret(os.environ)).join()"]


def start_ps(cluster: LocalCluster, index: int = 0):
    return cluster.start("ps", index, PS_ONLY)


def config_for(cluster: LocalCluster, job: str, index: int) -> ClusterConfig:
    return ClusterConfig(ClusterSpec.from_dict(cluster.spec), TaskId(job, index))


def secret_of(cluster: LocalCluster) -> JobSecret:
    return JobSecret(cluster.secret.encode(), "test")


def status(cluster: LocalCluster, index: int = 0, timeout_s: float = 10) -> StatusReply:
    client = RpcClient(cluster.spec["ps"][index], secret_of(cluster), f"ps:{index}", timeout_s)
    try:
        return StatusReply.decode(client.call("status").header)
    finally:
        client.close()


def wait_until_serving(cluster: LocalCluster, index: int = 0, timeout: float = 30) -> StatusReply:
    """ps `index`'s status once it answers; AssertionError (with every task's log) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return status(cluster, index, timeout_s=2)
        except ShoalError:
            assert time.monotonic() < deadline, cluster.dump()


def variables() -> dict[str, np.ndarray]:
    return {"w": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.zeros(2, np.float32)}


def grads(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {k: np.full_like(v, scale) for k, v in variables().items()}
