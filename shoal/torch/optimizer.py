"""`DistributedOptimizer`: a torch.optim optimizer whose step() runs on the parameter servers.

    opt = shoal.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, job)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)   # schedulers work
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step(); sched.step()
    opt.finish()

`opt.step()` pushes the model's gradients, with every param group's current lr and
weight_decay, and brings the new values into the model (the parameters share memory with
Shoal's copy on the CPU; on CUDA they are copied in). The update rule and its state live on the
ps (shoal/torch/rules.py says which optimizers and settings run there). Buffers (BatchNorm's
running statistics) stay on each replica; checkpoints and the export hold the chief's.
"""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any, Callable

import torch

from shoal.ps.protocol import Hyper
from shoal.torch.binding import ModelBinding, ModuleState
from shoal.torch.errors import TorchTrainError
from shoal.torch.job import Job
from shoal.torch.rules import check_unchanged, fixed_settings, group_hyper, update_rule
from shoal.train.options import SessionState
from shoal.train.session import TrainingSession
from shoal.train.shutdown import TrainingTerminated

log = logging.getLogger(__name__)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, job: Job,
                         **session: Any) -> "ParameterServerOptimizer":
    """Wrap `optimizer` (built from `model.parameters()`, groups allowed) so that it trains on
    the job's parameter servers, and start: the chief initializes the ps with the model's values
    (or the newest checkpoint in the model dir, buffers included), the others wait for it, and
    on return the model holds the ps values. Blocks (bounded by the session's timeouts).

    Create it after the model is complete and on its device, and after loading any weights.
    `session` overrides single TrainingSession options of the job (e.g. `request_timeout_s`).
    Raises TorchTrainError for an optimizer or setting the ps cannot run.
    """
    return ParameterServerOptimizer(optimizer, model, job, **session).start()


class ParameterServerOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer (so LR schedulers accept it) sharing `optimizer`'s param groups.

    Lifecycle (the session's SessionState): NEW (constructed; no I/O) -> STARTED (`start`) ->
    CLOSED (`finish`, or leaving a `with` block; by an exception, the ps are told this replica
    failed). A replica that exits without `finish()` is finished at exit with a warning (or
    marked failed if an exception ended the program), so the ps never wait for it forever.
    `step`, `pull` and `finish` block on the network; not thread-safe.

    The wrapped optimizer's own step() and state are never used: its state_dict() is empty;
    the update rule's state is on the ps and in Shoal's checkpoints.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, job: Job, **session: Any):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TorchTrainError(f"DistributedOptimizer wraps a torch.optim optimizer, got {type(optimizer).__name__}")
        self.rule = update_rule(optimizer)
        self._fixed = fixed_settings(optimizer)
        self.binding = ModelBinding(model, optimizer)
        local = ModuleState(model, self.binding.parameters)
        super().__init__(optimizer.param_groups, dict(optimizer.defaults))
        self.param_groups = optimizer.param_groups  # one list: a scheduler on either object drives both
        self.optimizer = optimizer
        self.job = job
        self.session = TrainingSession(job.config, self.binding.initial_values(), self.rule, secret=job.secret,
                                       **{**job.session_options, **session, "local_state": local if local.names else None})
        self.global_step = 0
        self._hyper_of: tuple[tuple, dict[str, Hyper]] = ((), {})  # the groups' (lr, weight decay), and `_hyper()`

    def start(self) -> "ParameterServerOptimizer":
        """Connect, initialize or wait for the chief, and make the model hold the ps values. Blocks."""
        self.session.start()
        self.binding.attach(self.session.params)
        self.job.leases.attach(self.session, self._values_changed)  # a LeasedSampler leases through this session
        self.global_step = self.session.global_step
        atexit.register(self._at_exit)
        return self

    def __enter__(self) -> "ParameterServerOptimizer":
        return self if self.session.state is SessionState.STARTED else self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._close_failed(exc_type, exc, tb)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Push the gradients of this step, with every group's lr and weight_decay (and the
        positions a LeasedSampler handed out since the last step), and bring the updated
        values into the model. Returns `closure()`'s loss if a closure is given.
        Blocks until the ps answer (in sync mode, until the step's gradients are all in).

        Raises TorchTrainError when it would train nothing: no backward() since the last step,
        a parameter replaced, moved or changed in place behind the optimizer, a fixed setting
        (momentum, betas, ...) changed, or the optimizer already finished.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.session.state is not SessionState.STARTED:
            raise TorchTrainError(f"{self.job.task}: step() on a DistributedOptimizer that is "
                                  f"{self.session.state.value}; create it with shoal.torch.DistributedOptimizer(...) "
                                  "(which starts it) and call finish() only after the last step")
        self.binding.check()
        check_unchanged(self._fixed, self.param_groups)
        grads = self.binding.gradients()
        try:
            result = self.session.push(grads, self._hyper(), used=self.job.leases.take_used())
        except TrainingTerminated:  # SIGTERM: the chief saved; leave as the session's `with` would
            self._close_failed(*sys.exc_info())
            raise
        self.binding.pushed()
        self.binding.refresh(self.session.params)
        self.global_step = result.global_step
        return loss

    def _values_changed(self) -> None:
        """The session's values moved without a step of this optimizer (a sync step its sampler
        took part in with no data): into the model, and the global step with them."""
        self.binding.refresh(self.session.params)
        self.global_step = self.session.global_step

    def pull(self) -> int:
        """Bring the ps's current values into the model now (in async mode other replicas keep
        updating them). Returns the global step. Blocks."""
        self.binding.check()
        self.global_step = self.session.pull()
        self.binding.refresh(self.session.params)
        return self.global_step

    def finish(self) -> None:
        """End training for this replica: bring the ps's final values into the model, save the
        final checkpoint and the export (chief, with a model dir), tell the ps this replica is
        done, disconnect. Idempotent. Blocks."""
        if self.session.state is not SessionState.STARTED:
            self.session.close()
            return
        atexit.unregister(self._at_exit)
        try:
            self.pull()
        except BaseException as e:
            self._close_failed(type(e), e, e.__traceback__)
            raise
        self.session.__exit__(None, None, None)

    def _close_failed(self, exc_type, exc, tb) -> None:
        atexit.unregister(self._at_exit)
        self.session.__exit__(exc_type, exc, tb)

    def _at_exit(self) -> None:
        if self.session.state is not SessionState.STARTED:
            return
        uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if uncaught is not None:
            self._close_failed(type(uncaught), uncaught, uncaught.__traceback__)
            return
        log.warning("%s: the program ended without opt.finish(); finishing now (final checkpoint, then telling the "
                    "ps this replica is done). Call opt.finish() after the training loop", self.job.task)
        self.finish()

    def _hyper(self) -> dict[str, Hyper]:
        """Variable -> its param group's learning rate and weight decay now: checked and built
        again only when some group's changed (a scheduler's step); else the last step's dict."""
        now = tuple((float(group.get("lr", 0.0)), float(group.get("weight_decay", 0.0)))
                    for group in self.param_groups)
        if now != self._hyper_of[0]:
            per_group = [group_hyper(group, i) for i, group in enumerate(self.param_groups)]
            self._hyper_of = (now, {name: per_group[group] for name, group in self.binding.group_of.items()})
        return self._hyper_of[1]
