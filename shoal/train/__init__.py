"""Worker side: placement, the push/pull session, chief duties, data sharding, model adapters.

The names below load on first use, so a ps task that imports `shoal.train.roles` or a program
that imports `shoal.train.flags` does not pull in the session, checkpoints and summaries
(safetensors, tensorboardX): a ps stays small and starts fast.
"""

from importlib import import_module

_EXPORTS = {
    "shoal.train.data": ("ShardedBatches",),
    "shoal.train.errors": ("TrainError",),
    "shoal.train.placement": ("Placement", "PlacementStrategy", "place_variables"),
    "shoal.train.options": ("CheckpointOptions", "SessionState", "StepResult", "SyncOptions"),
    "shoal.train.session": ("TrainingSession",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal.train' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
