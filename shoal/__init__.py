"""Shoal: parameter-server distributed training for Python.

    config = shoal.resolve_cluster_config(args, os.environ)   # TF_CONFIG or --ps_hosts ... flags
    if config.task.job == "ps":
        shoal.Server.for_task(config).join()                 # returns when the job is over
    else:
        with shoal.TrainingSession(config, variables, shoal.SGD(0.5)) as session:
            ...

Importing `shoal` does not import PyTorch (see `shoal.train.torch_model`), so ps tasks stay small.
"""

from shoal.cluster import ClusterConfig, ClusterError, ClusterSpec, TaskId, add_cluster_flags, resolve_cluster_config
from shoal.errors import ShoalError
from shoal.ps import SGD, Adagrad, Adam, Momentum, PsError, Server, UpdateRule
from shoal.train import (PlacementStrategy, ShardedBatches, StepResult, SyncOptions, TrainError, TrainingSession)
from shoal.train.local import LocalCluster, create_local_server
from shoal.wire import JobSecret

__version__ = "0.1.0"

__all__ = ["SGD", "Adagrad", "Adam", "ClusterConfig", "ClusterError", "ClusterSpec", "JobSecret", "LocalCluster",
           "Momentum", "PlacementStrategy", "PsError", "Server", "ShardedBatches", "ShoalError", "StepResult",
           "SyncOptions", "TaskId", "TrainError", "TrainingSession", "UpdateRule", "add_cluster_flags",
           "create_local_server", "resolve_cluster_config"]
