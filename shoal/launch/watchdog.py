"""`Watchdog`: notices a job that is alive but stuck, and names the tasks it is stuck on.

It follows the job's global step — the highest `step=` of the tasks' progress lines
(progress_line.py) — and when each training task (chief, worker) last printed one. A task whose
own step passed the last it printed also counts as progress, though the highest step stays: a
program that prints each replica's own step (a plain PyTorch loop, uneven shards) goes on after
its fastest replica finished. When no step has advanced for `stall` seconds, `check` returns a
`Stall` that names the stuck
tasks; the Supervisor applies the spec's action (restart the stuck tasks, restart the job,
or fail it). It never fires before the first progress line: a program that prints none is
never judged, nor is a job still starting.

Which tasks are stuck, first rule that names any:

1. the tasks the waiting workers name, since the step last advanced ("worker:0 waiting for
   worker:1", "waiting for ps:0 ... to answer": shoal/train/stalls.py logs them while a
   request waits), if they are still running;
2. of the training tasks that printed no progress since the step last advanced, those whose
   last progress line is the oldest (within TIE_S; never is oldest); else, when one training
   task is left running and its line advanced the step, that task if it printed nothing since;
3. every running training task (they all print, yet the step stays).

The stall is `WatchdogSpec.stall`, else DEFAULT_STALL_S or twice the chief's checkpoint
interval (`--checkpoint_every_secs N` in its command), whichever is longer: a chief that
checkpoints holds a sync step meanwhile (`effective_stall`). The default also grows to 3x the
longest the step has taken to advance so far, so a job that legitimately prints rarely (a large
`--log_every`, slow steps, a long evaluation between steps once seen) is not called stuck. The
Supervisor does not check while a task is being restarted, and a restarted task opens a fresh
window (a restarted ps also makes it wait for the step to pass the old one again).

Pure policy: time comes from the injected clock, so it is tested without processes.
`progress` and `waiting` are called from log-reader threads, the rest from the supervisor's
thread: every method is thread-safe (one lock) and none blocks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from shoal.launch.spec import DEFAULT_STALL_S, WatchdogAction, WatchdogSpec

TIE_S = 1.0
"""Last progress lines this close in time count as equally old."""

TRAINING_JOBS = ("chief", "worker")
_CHECKPOINT_FLAG = "--checkpoint_every_secs"


@dataclass(frozen=True)
class Stall:
    """The step stayed at `step` for `seconds`; `stuck` are the tasks blamed (task names,
    "worker.1"), `why` says how they were found."""

    step: int
    seconds: float
    stuck: tuple[str, ...]
    why: str

    def describe(self) -> str:
        """One line: "no progress for 300s at step 1200; stuck: worker.1 (its last progress is the oldest)"."""
        return (f"no progress for {self.seconds:.0f}s at step {self.step}; stuck:"
                f" {', '.join(self.stuck)} ({self.why})")


def effective_stall(spec: WatchdogSpec, chief_argv: Sequence[str]) -> Optional[float]:
    """The stall in seconds the watchdog uses, or None when it is off."""
    if not spec.enabled or spec.stall == 0:
        return None
    if spec.stall is not None:
        return spec.stall
    interval = checkpoint_interval(chief_argv)
    return max(DEFAULT_STALL_S, 2 * interval) if interval else DEFAULT_STALL_S


def checkpoint_interval(argv: Sequence[str]) -> Optional[float]:
    """The `--checkpoint_every_secs` a Shoal program's argv gives (shoal/train/flags.py), or None."""
    value: Optional[str] = None
    for i, arg in enumerate(argv):
        if arg == _CHECKPOINT_FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(_CHECKPOINT_FLAG + "="):
            value = arg.split("=", 1)[1]
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Watchdog:
    """The stall detector of one job; `action` and `max_restarts` are the spec's, for the
    Supervisor. `stall` is in seconds (effective_stall)."""

    def __init__(self, stall: float, action: WatchdogAction, max_restarts: int,
                 training: Iterable[str], clock: Callable[[], float], adaptive: bool = False) -> None:
        self.stall = stall
        self.adaptive = adaptive  # the default stall: at least 3x the slowest advance seen so far
        self._longest_gap = 0.0
        self.action = action
        self.max_restarts = max_restarts
        self._training = tuple(training)
        self._clock = clock
        self._lock = threading.Lock()
        self._step: Optional[int] = None
        self._advanced = 0.0
        self._last: dict[str, float] = {}
        self._own: dict[str, int] = {}  # the step each task printed last
        self._waited: dict[str, float] = {}

    @classmethod
    def for_spec(cls, spec: WatchdogSpec, tasks: Sequence[tuple[str, Sequence[str]]],
                 primary: str, clock: Callable[[], float]) -> Optional["Watchdog"]:
        """The watchdog of a job whose tasks are (name, argv) and whose chief is `primary`
        (a task name), or None if the spec turns it off."""
        argv = next((a for name, a in tasks if name == primary), ())
        stall = effective_stall(spec, argv)
        if stall is None:
            return None
        training = [name for name, _ in tasks if name.split(".")[0] in TRAINING_JOBS]
        return cls(stall, spec.action, spec.max_restarts, training, clock, adaptive=spec.stall is None)

    def progress(self, name: str, step: int) -> None:
        """Task `name` printed a progress line at global step `step`."""
        now = self._clock()
        with self._lock:
            self._last[name] = now
            own, self._own[name] = self._own.get(name), step
            if self._step is None or step > self._step or (own is not None and step > own):
                if self._step is not None:  # a job that prints rarely (big log_every, slow steps) is not stuck
                    self._longest_gap = max(self._longest_gap, now - self._advanced)
                self._step = step if self._step is None else max(self._step, step)
                self._advanced = now
                self._waited.clear()

    def waiting(self, name: str, waited: Sequence[str]) -> None:
        """Task `name` said it waits for the tasks `waited`."""
        now = self._clock()
        with self._lock:
            for task in waited:
                if task != name:
                    self._waited[task] = now

    def reset(self, forget_step: bool = False) -> None:
        """Start a fresh stall window now (after a restart); `forget_step` also waits for a
        first progress line again (the whole job restarted)."""
        now = self._clock()
        with self._lock:
            self._advanced = now
            self._waited.clear()
            if forget_step:
                self._step = None
                self._last.clear()
                self._own.clear()

    def check(self, running: Iterable[str]) -> Optional[Stall]:
        """The stall, if the step has not advanced for `stall` seconds; `running` are the
        tasks running now (only they are blamed)."""
        now = self._clock()
        running = set(running)
        with self._lock:
            if self._step is None or now - self._advanced < self.limit_s():
                return None
            stuck, why = self._blame(running)
            return Stall(self._step, now - self._advanced, stuck, why)

    def limit_s(self) -> float:
        """How long the step may stay put now: `stall`, or with the default stall at least 3x
        the longest the step took to advance so far. Call with the lock held."""
        return max(self.stall, 3 * self._longest_gap) if self.adaptive else self.stall

    def _blame(self, running: set[str]) -> tuple[tuple[str, ...], str]:
        waited = [t for t in self._waited if t in running]
        if waited:
            return tuple(sorted(waited)), "the waiting workers wait for it" if len(waited) == 1 \
                else "the waiting workers wait for them"
        training = [t for t in self._training if t in running]
        silent = [t for t in training if self._last.get(t, float("-inf")) < self._advanced]
        if not silent and len(training) == 1 and self._last.get(training[0]) == self._advanced:
            # the only task left printed the step that advanced it, and nothing since
            return tuple(training), "it printed the last step and nothing since"
        if silent:
            oldest = min(self._last.get(t, float("-inf")) for t in silent)
            stuck = tuple(t for t in silent if self._last.get(t, float("-inf")) <= oldest + TIE_S)
            if oldest == float("-inf"):
                return stuck, "no progress line since it started"
            return stuck, "its last progress is the oldest" if len(stuck) == 1 \
                else "their last progress is the oldest"
        return tuple(training), "every worker prints, yet the step stays"
