"""Shoal: parameter-server distributed training for Python.

    config = shoal.resolve_cluster_config(args, os.environ)   # TF_CONFIG or --ps_hosts ... flags
    secret = shoal.resolve_job_secret(os.environ)            # the job's shared secret
    if config.task.job == "ps":
        shoal.Server.for_task(config, secret=secret).join()  # returns when the job is over
    else:
        with shoal.TrainingSession(config, variables, shoal.SGD(0.5), secret=secret) as session:
            ...

The names below load on first use, so `import shoal.cli` (the launcher) does not pull in the
runtime, and importing `shoal` never imports PyTorch (see `shoal.train.torch_model`).
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "shoal.cluster": ("ClusterConfig", "ClusterError", "ClusterSpec", "TaskId", "add_cluster_flags",
                      "resolve_cluster_config"),
    "shoal.errors": ("ShoalError",),
    "shoal.job_secret": ("resolve_job_secret",),
    "shoal.ps": ("SGD", "Adagrad", "Adam", "Momentum", "PsError", "Server", "UpdateRule"),
    "shoal.train": ("CheckpointOptions", "PlacementStrategy", "SessionState", "ShardedBatches", "StepResult",
                    "SyncOptions", "TrainError", "TrainingSession"),
    "shoal.train.flags": ("add_training_flags", "session_options"),
    "shoal.train.progress": ("ProgressReporter",),
    "shoal.train.roles": ("serve_unless_training",),
    "shoal.train.local": ("LocalCluster", "create_local_server"),
    "shoal.wire": ("JobSecret",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
