"""Worker side: placement, the push/pull session, chief duties, data sharding, model adapters.

The names below load on first use, so a ps task that imports `shoal.train.roles` or a program
that imports `shoal.train.flags` does not pull in the session, checkpoints and summaries
(safetensors, tensorboardX): a ps stays small and starts fast.
"""

from shoal.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    "shoal.train.data": ("ShardedBatches",),
    "shoal.train.leased_data": ("LeasedBatch", "LeasedBatches", "LeaseWaitError"),
    "shoal.train.coordinator": ("Coordinator", "CoordinatorState", "PerWorkerDataset"),
    "shoal.train.coordinator_errors": ("CoordinatorError", "StepFailedError"),
    "shoal.train.coordinator_executor": ("WorkerContext",),
    "shoal.train.coordinator_registry": ("StepRegistry",),
    "shoal.train.coordinator_service": ("serve_steps",),
    "shoal.train.remote_value": ("ClosureState", "RemoteValue"),
    "shoal.train.errors": ("TrainError",),
    "shoal.train.part_size": ("PartSize",),
    "shoal.train.placement": ("Placement", "PlacementStrategy", "place_variables"),
    "shoal.train.options": ("CheckpointOptions", "SessionState", "StepResult", "SyncOptions"),
    "shoal.train.session": ("TrainingSession",),
    "shoal.train.shutdown": ("TrainingTerminated",),
})
