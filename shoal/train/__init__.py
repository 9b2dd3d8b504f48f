"""Worker side: placement, the push/pull session, chief duties, data sharding, model adapters."""

from shoal.train.data import ShardedBatches
from shoal.train.errors import TrainError
from shoal.train.placement import Placement, PlacementStrategy, place_variables
from shoal.train.options import CheckpointOptions, SessionState, StepResult, SyncOptions
from shoal.train.session import TrainingSession

__all__ = ["CheckpointOptions", "Placement", "PlacementStrategy", "SessionState", "ShardedBatches", "StepResult",
           "SyncOptions", "TrainError", "TrainingSession", "place_variables"]
