"""`Checkpointer.save_if_due` says whether a periodic checkpoint was due, from the one check it
made (`checkpoint_if_due` returns that, instead of asking `due` a second time)."""

import numpy as np

from shoal.train.checkpointer import Checkpointer
from shoal.train.options import CheckpointOptions
from shoal.train.placement import PlacementStrategy, place_variables


def test_save_if_due_returns_false_when_no_checkpoint_is_due_and_touches_no_ps(tmp_path):
    placement = place_variables({"w": np.zeros(4, np.float32)}, 1, PlacementStrategy.GREEDY)
    checkpointer = Checkpointer(tmp_path, CheckpointOptions(every_steps=10, every_s=None), placement, "chief:0")
    checkpointer.mark_saved(0)
    assert checkpointer.save_if_due(None, 9) is False  # no client needed: nothing is saved
    assert checkpointer.saves == 0
