"""`LocalState`: tensors of the model that a worker keeps itself, not on the ps, but that belong
in checkpoints and in the export: a PyTorch module's buffers (BatchNorm's running_mean,
running_var, num_batches_tracked) and parameters no optimizer trains.

Every replica updates its own copy; checkpoints and the export hold the chief's (the chief
passes its LocalState to its TrainingSession), and a chief that initializes the job from a
checkpoint gets them back. Other workers keep their own values.
"""

from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np


class LocalState(Protocol):
    """What a TrainingSession needs of a worker's local tensors. Calls block (a CUDA copy at
    most); the session calls them from its own thread only."""

    def values(self) -> dict[str, np.ndarray]:
        """name -> a CPU copy of each tensor's current value (names distinct from the variables')."""

    def restore(self, values: Mapping[str, np.ndarray]) -> None:
        """Set every tensor from `values` (which holds each name `values()` returns)."""
