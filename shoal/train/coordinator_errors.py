"""Errors of in-graph training: the coordinator's and its workers'."""

from __future__ import annotations

from shoal.train.errors import TrainError


class CoordinatorError(TrainError):
    """The coordinator cannot schedule or finish a step (no worker answers, it was closed, ...)."""


class BadValueError(CoordinatorError):
    """A step argument or result cannot travel on the wire (only tensors and plain values can)."""


class UnknownStepError(CoordinatorError):
    """A step or dataset name is not registered in the program's StepRegistry."""


class StepFailedError(CoordinatorError):
    """A step raised on a worker. `worker` is the task it ran on, `step` its name, `last_line`
    the last line of the remote traceback ("ValueError: ...") and `remote_traceback` all of it."""

    def __init__(self, worker: str, step: str, last_line: str, remote_traceback: str = ""):
        super().__init__(f"step {step!r} failed on {worker}: {last_line}")
        self.worker = worker
        self.step = step
        self.last_line = last_line
        self.remote_traceback = remote_traceback
