"""Errors of the PyTorch API."""

from shoal.train.errors import TrainError


class TorchTrainError(TrainError):
    """A PyTorch program used `shoal.torch` in a way that would not train what it says: an
    optimizer the ps cannot run, a model changed behind the optimizer's back, a step without
    gradients. The message names the parameter or setting and the fix."""
