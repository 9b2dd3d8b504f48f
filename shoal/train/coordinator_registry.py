"""`StepRegistry`: the functions a coordinator may run on its workers, by name.

Every task runs the same program, so the coordinator and its workers build the same registry
at import time; a request names a function, and nothing executable crosses the network.

    steps = shoal.StepRegistry()

    @steps.dataset
    def batches(ctx, batch_size):          # runs once per worker: its own data
        return iter(...)

    @steps.step
    def train(ctx, it):                    # runs on whichever worker is free
        x, y = next(it)
        loss, _ = ctx.session.run_step(loss_and_grad, x, y)
        return loss

Step functions take the worker's `WorkerContext` first, then the scheduled arguments; dataset
functions take the context and their arguments and return an iterable. Registering is meant
for import time (not thread-safe then); lookups are thread-safe.
"""

from __future__ import annotations

from typing import Any, Callable

from shoal.train.coordinator_errors import CoordinatorError, UnknownStepError

MAX_NAME = 128
StepFn = Callable[..., Any]


class StepRegistry:
    """Step and dataset functions by name. No I/O."""

    def __init__(self) -> None:
        self._steps: dict[str, StepFn] = {}
        self._datasets: dict[str, StepFn] = {}

    def step(self, fn: StepFn | None = None, *, name: str | None = None):
        """Register `fn` as a step (decorator, bare or with `name=`). Returns `fn` unchanged."""
        return self._register(self._steps, "step", fn, name)

    def dataset(self, fn: StepFn | None = None, *, name: str | None = None):
        """Register `fn` as a per-worker dataset function. Returns `fn` unchanged."""
        return self._register(self._datasets, "dataset", fn, name)

    def step_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._steps))

    def dataset_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._datasets))

    def get_step(self, name: str) -> StepFn:
        """The step named `name`; UnknownStepError listing the registered ones if there is none."""
        return _lookup(self._steps, "step", name)

    def get_dataset(self, name: str) -> StepFn:
        return _lookup(self._datasets, "dataset", name)

    @staticmethod
    def name_of(fn_or_name: StepFn | str) -> str:
        """A registered function's name (a function is named by its __name__ or `name=`)."""
        if isinstance(fn_or_name, str):
            return fn_or_name
        name = getattr(fn_or_name, "__shoal_step_name__", None)
        if name is None:
            raise UnknownStepError(f"{fn_or_name!r} was never registered; decorate it with @registry.step "
                                   "(or @registry.dataset) at import time so every task knows it")
        return name

    def _register(self, table: dict[str, StepFn], kind: str, fn: StepFn | None, name: str | None):
        def add(f: StepFn) -> StepFn:
            key = name or getattr(f, "__name__", None)
            if not isinstance(key, str) or not 0 < len(key) <= MAX_NAME:
                raise CoordinatorError(f"a {kind} needs a name of 1 to {MAX_NAME} characters, got {key!r:.50}; "
                                       f"pass name=")
            if key in table and table[key] is not f:
                raise CoordinatorError(f"a {kind} named {key!r} is already registered; give this one another "
                                       "name= (names must be unique within a program)")
            table[key] = f
            try:
                f.__shoal_step_name__ = key
            except (AttributeError, TypeError):
                pass  # a builtin or partial: callers then schedule it by name
            return f
        return add(fn) if fn is not None else add


def _lookup(table: dict[str, StepFn], kind: str, name: str) -> StepFn:
    fn = table.get(name)
    if fn is None:
        known = ", ".join(sorted(table)) or "none"
        raise UnknownStepError(f"no {kind} named {name!r:.80} is registered (registered {kind}s: {known}); "
                               f"register it with @registry.{kind} in the program every task runs")
    return fn
