"""Shoal: parameter-server distributed training for Python.

    config = shoal.resolve_cluster_config(args, os.environ)   # TF_CONFIG or --ps_hosts ... flags
    secret = shoal.resolve_job_secret(os.environ)            # the job's shared secret
    if config.task.job == "ps":
        shoal.Server.for_task(config, secret=secret).join()  # returns when the job is over
    else:
        with shoal.TrainingSession(config, variables, shoal.SGD(0.5), secret=secret) as session:
            ...

PyTorch programs use `shoal.torch` instead (docs/pytorch.md): `init`, `DistributedOptimizer`,
`DistributedSampler`.

The names below load on first use, so `import shoal.cli` (the launcher) does not pull in the
runtime, and importing `shoal` never imports PyTorch (see `shoal.train.torch_model`).
"""

from shoal.lazy import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    "shoal.cluster": ("ClusterConfig", "ClusterError", "ClusterSpec", "TaskId", "add_cluster_flags",
                      "resolve_cluster_config"),
    "shoal.errors": ("ShoalError",),
    "shoal.job_secret": ("resolve_job_secret",),
    "shoal.ps": ("SGD", "Adagrad", "Adam", "AdamW", "Momentum", "PsError", "Server", "UpdateRule"),
    "shoal.train": ("CheckpointOptions", "PlacementStrategy", "SessionState", "ShardedBatches", "StepResult",
                    "SyncOptions", "TrainError", "TrainingSession"),
    "shoal.train.coordinator": ("Coordinator", "PerWorkerDataset"),
    "shoal.train.coordinator_errors": ("CoordinatorError", "StepFailedError"),
    "shoal.train.coordinator_registry": ("StepRegistry",),
    "shoal.train.coordinator_service": ("serve_steps",),
    "shoal.train.remote_value": ("ClosureState", "RemoteValue"),
    "shoal.train.coordinator_executor": ("WorkerContext",),
    "shoal.train.model_dir_lock": ("ModelDirLockedError",),
    "shoal.train.flags": ("add_training_flags", "replication_options", "session_options", "wire_security"),
    "shoal.ps.replicator": ("ReplicationOptions",),
    "shoal.train.leased_data": ("LeasedBatch", "LeasedBatches", "LeaseWaitError"),
    "shoal.train.progress": ("ProgressReporter",),
    "shoal.train.shutdown": ("TrainingTerminated",),
    "shoal.train.roles": ("serve_unless_training",),
    "shoal.train.local": ("LocalCluster", "create_local_server"),
    "shoal.wire": ("JobSecret", "SecretError", "Security"),
})
