"""Membership: which training replicas a ps counts as live, under a version number.

Every training replica (the chief and the workers) sends a `heartbeat` to every ps from a
thread of its own, declaring how long it may stay silent (`timeout`). A heartbeat from a task
the ps does not count as training makes it a member — a worker may join at any time, named in
the ps's cluster or not. A member leaves when it says `done` (final: it trained to the end),
says `failed` (it may come back: its next process heartbeats again), or misses its heartbeat
timeout (LOST: that same process is a member again once it echoes the challenge the ps's reply
gave it, see `Membership.challenge`). Replicas named in the ps's own cluster are EXPECTED from
the start, so a sync step does not run short while they start up; one not heard from within
`join_grace_s` is LOST too. Every change bumps `version` and is returned as a `Change` the ps logs.

"The job is over" is decided here against the live membership and the chief's word: the chief
said done and no member is still training (EXPECTED or TRAINING) — or every member failed.

Every ps keeps its own membership from the same heartbeats (a replica heartbeats all of them
together), so the ps tasks of a job see the same joins at the same time and drop a silent
member after the same timeout; `version` counts the changes one ps saw. Each ps applies a
change to its own sync quorum at once (a departure) or at its next step boundary (a join).

Pure bookkeeping: no I/O, no clock of its own (callers pass monotonic `now`; the challenges are
random, or made by `new_challenge`). Not thread-safe (one per ps, on its serving thread).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Sequence

DEFAULT_JOIN_GRACE_S = 120.0
"""How long a replica named in the cluster counts as expected before it is heard from."""

MIN_TIMEOUT_S = 0.5
MAX_TIMEOUT_S = 3600.0


def heartbeat_interval(timeout_s: float) -> float:
    """How often a replica heartbeats: four times per timeout, at most every 5 s, at least
    every 0.1 s."""
    return min(5.0, max(0.1, timeout_s / 4))


def answer_window_s(timeout_s: float) -> float:
    """How long a rejoin challenge may be answered after it was made: two heartbeat intervals,
    at least 1 s (a reply and the answer sent at once, on a loaded machine)."""
    return max(1.0, 2 * heartbeat_interval(timeout_s))


class MemberState(str, Enum):
    """Where one replica is, as this ps sees it."""

    EXPECTED = "expected"  # named in the ps's cluster, not heard from yet
    TRAINING = "training"  # heartbeating
    DONE = "done"          # said done: trained to the end (final)
    FAILED = "failed"      # said failed: left by an error, may come back
    LOST = "lost"          # missed its heartbeat (or never came): dropped until it answers a challenge, or restarts


LIVE = (MemberState.EXPECTED, MemberState.TRAINING)

_REPLACED_KEPT = 8
"""How many replaced processes of one task are remembered, so their late heartbeats are ignored."""


@dataclass(frozen=True)
class Change:
    """One membership change: `task` went from `before` (None: never seen) to `after`."""

    task: str
    before: MemberState | None
    after: MemberState
    why: str = ""
    applied: int | None = None  # a departure: how many of its gradients this ps applied
    terminated: bool = False  # FAILED by SIGTERM (stopped), not by an error

    @property
    def live_changed(self) -> bool:
        """Whether the change adds to or removes from the live members."""
        return (self.before in LIVE) != (self.after in LIVE)

    def describe(self) -> str:
        """E.g. "worker:3 joined", "worker:1 left (no heartbeat for 20s)"."""
        if self.after is MemberState.EXPECTED:
            verb = "expected"
        elif self.after is MemberState.TRAINING:
            verb = "joined" if self.before in (None, MemberState.EXPECTED) else "rejoined"
        else:
            verb = {MemberState.DONE: "finished", MemberState.FAILED: "stopped" if self.terminated else "failed",
                    MemberState.LOST: "left"}[self.after]
        notes = [n for n in (self.why, f"{self.applied} gradients applied" if self.applied is not None else "") if n]
        return f"{self.task} {verb}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass
class _Member:
    state: MemberState
    deadline: float  # EXPECTED: end of the join grace; TRAINING: last heartbeat + its timeout
    timeout_s: float = 0.0
    failed_incarnation: str = ""
    terminated: bool = False  # FAILED by SIGTERM (stopped), not by an error
    incarnation: str = ""  # TRAINING (and LOST by silence): the process whose heartbeats made it a member
    challenge: str = ""  # LOST by silence: what a heartbeat of that same process must echo to rejoin
    challenged_at: float = 0.0  # when `challenge` was made (it is answerable for `answer_window_s`)


class Membership:
    """The replicas one ps counts. `expected`: the replicas its cluster names (chief first);
    `chief`: the chief's task name ("chief:0", or "worker:0" without a chief job)."""

    def __init__(self, expected: Sequence[str], chief: str | None, now: float, *,
                 join_grace_s: float = DEFAULT_JOIN_GRACE_S,
                 new_challenge: Callable[[], str] = lambda: secrets.token_hex(8)) -> None:
        self.chief = chief
        self.join_grace_s = join_grace_s
        self._new_challenge = new_challenge
        self.version = 1
        self._members: dict[str, _Member] = {t: _Member(MemberState.EXPECTED, now + join_grace_s) for t in expected}
        self._replaced: dict[str, list[str]] = {}  # per task, the processes a newer one replaced (a few newest)
        self._applied: dict[str, int] = {}  # per replica, gradients applied on this ps (bounded by members)

    # --- what replicas say ----------------------------------------------------------------

    def heartbeat(self, task: str, incarnation: str, timeout_s: float, now: float, answer: str = "") -> Change | None:
        """`task` is alive and training for `timeout_s` more seconds. Returns the Change if it
        (re)joined. Ignored from a task that said done, and from the process that said failed
        (a heartbeat of it still on the way); its restarted process rejoins. A process dropped
        for its silence rejoins only with a heartbeat whose `answer` is its `challenge` (see
        there): proof that it is alive now."""
        timeout_s = min(MAX_TIMEOUT_S, max(MIN_TIMEOUT_S, timeout_s))
        if incarnation and incarnation in self._replaced.get(task, ()):
            return None  # a late heartbeat of a process a newer one replaced
        member = self._members.get(task)
        if member is not None and (member.state is MemberState.DONE or
                                   (member.state in (MemberState.FAILED, MemberState.LOST)
                                    and member.failed_incarnation and incarnation == member.failed_incarnation)):
            return None
        if member is not None and member.state is MemberState.TRAINING:
            member.deadline, member.timeout_s = now + timeout_s, timeout_s
            return None
        if (member is not None and member.state is MemberState.LOST and member.incarnation
                and incarnation == member.incarnation
                and not (answer and answer == member.challenge
                         and now - member.challenged_at <= answer_window_s(member.timeout_s))):
            return None  # dropped for its silence: only an answer to a fresh challenge proves it alive
        before = member.state if member is not None else None
        if member is not None and member.incarnation and incarnation and incarnation != member.incarnation:
            self._remember_replaced(task, member.incarnation)  # its late heartbeats must not evict this one
        self._members[task] = _Member(MemberState.TRAINING, now + timeout_s, timeout_s, incarnation=incarnation)
        return self._changed(Change(task, before, MemberState.TRAINING))

    def challenge(self, task: str, incarnation: str, now: float) -> str:
        """What the next heartbeat of `task`'s process `incarnation` must carry as its `answer`
        to be a member again, "" when it needs none: a process dropped for its silence gets one
        in the reply to each heartbeat it sends after that, made anew once it is older than
        `answer_window_s`. The heartbeats it sent before such a reply cannot carry it, and those
        are the ones that mislead: a link that was cut holds the heartbeats of a process that
        died meanwhile (the launcher restarted the task elsewhere) and delivers them together, or
        in bursts seconds apart (one per connection), when it comes up again. An answer is only
        taken within the window, so one held back too (its process answered, then its link was
        cut) is stale by the time it comes. A live process answers in a heartbeat it sends as
        soon as the reply came, and rejoins with it."""
        member = self._members.get(task)
        if (member is None or member.state is not MemberState.LOST or not member.incarnation
                or incarnation != member.incarnation):
            return ""
        if not member.challenge or now - member.challenged_at > answer_window_s(member.timeout_s):
            member.challenge, member.challenged_at = self._new_challenge(), now
        return member.challenge

    def _remember_replaced(self, task: str, incarnation: str) -> None:
        replaced = self._replaced.setdefault(task, [])
        replaced.append(incarnation)
        del replaced[:-_REPLACED_KEPT]

    def replaced(self, task: str, incarnation: str) -> Change | None:
        """A heartbeat of `task` from process `incarnation`: if another process of it is the
        training member, that one is gone (a task's identity runs once: the launcher restarted
        it after a SIGKILL, which sends no 'failed'). It leaves now, as it would once its
        heartbeats were overdue, so a sync step stops waiting for its gradient; the new process
        then joins with `heartbeat`. Returns the change, None if there is none."""
        member = self._members.get(task)
        if (member is None or member.state is not MemberState.TRAINING or not member.incarnation
                or not incarnation or incarnation == member.incarnation
                or incarnation in self._replaced.get(task, ())):
            return None
        self._remember_replaced(task, member.incarnation)
        return self._leave(task, MemberState.LOST, why="a new process of it heartbeats: it was restarted")

    def adopt(self, live: Iterable[str], now: float) -> list[Change]:
        """This ps restarted and was rebuilt: the other ps tasks count `live` as training. Those
        are expected (their heartbeats come within an interval); a replica of this ps's cluster
        that is not among them left while this ps was down. Returns the changes."""
        live = set(live)
        changes = []
        for task in sorted(live):
            member = self._members.get(task)
            if member is None or member.state not in LIVE:
                before = member.state if member is not None else None
                self._members[task] = _Member(MemberState.EXPECTED, now + self.join_grace_s)
                changes.append(Change(task, before, MemberState.EXPECTED, "training on the other ps"))
        for task, member in self._members.items():
            if task not in live and member.state is MemberState.EXPECTED:
                member.state = MemberState.LOST
                changes.append(Change(task, MemberState.EXPECTED, MemberState.LOST, "not training on the other ps"))
        for change in changes:
            self._changed(change)
        return changes

    def seen(self, task: str, now: float) -> None:
        """A request from `task` (a push) is as good as a heartbeat for a training member."""
        member = self._members.get(task)
        if member is not None and member.state is MemberState.TRAINING:
            member.deadline = max(member.deadline, now + member.timeout_s)

    def count_applied(self, task: str) -> None:
        """A gradient of `task` (a whole push, all its parts) was applied or counted in a sync
        step on this ps. Only members are counted."""
        if task in self._members:
            self._applied[task] = self._applied.get(task, 0) + 1

    def applied(self, task: str) -> int:
        return self._applied.get(task, 0)

    def finished(self, task: str) -> Change | None:
        """`task` said done. Final: the ps no longer waits for it, nor takes it back."""
        return self._leave(task, MemberState.DONE)

    def failed(self, task: str, incarnation: str = "", terminated: bool = False, started: bool = True) -> Change | None:
        """`task` said failed (its `incarnation`, if it sent one, is not taken back);
        `terminated`: it was stopped by SIGTERM, not by an error; not `started`: its start
        failed before it trained — it leaves (LOST) but is no failed replica."""
        member = self._members.get(task)
        if member is not None and member.state is MemberState.DONE:
            return None
        if not started:
            change = self._leave(task, MemberState.LOST, why="its start failed")
            self._members[task].failed_incarnation = incarnation
            return change
        change = self._leave(task, MemberState.FAILED, terminated)
        self._members[task].failed_incarnation = incarnation
        return change

    def expire(self, now: float) -> list[Change]:
        """Drop every member whose heartbeat is overdue (or that never came). Returns the changes."""
        changes = []
        for task, member in self._members.items():
            if member.state in LIVE and now > member.deadline:
                why = (f"no heartbeat for {member.timeout_s:g}s" if member.state is MemberState.TRAINING
                       else f"not heard from within {self.join_grace_s:g}s of the start")
                changes.append(Change(task, member.state, MemberState.LOST, why, self._applied.get(task, 0)))
                member.state = MemberState.LOST
        for change in changes:
            self._changed(change)
        return changes

    # --- what the ps asks -----------------------------------------------------------------

    @property
    def training(self) -> tuple[str, ...]:
        """The live members (EXPECTED or TRAINING): chief first, then in the order first seen."""
        live = [t for t, m in self._members.items() if m.state in LIVE]
        return tuple(sorted(live, key=lambda t: t != self.chief))

    def state(self, task: str) -> MemberState | None:
        member = self._members.get(task)
        return member.state if member is not None else None

    def tasks_in(self, *states: MemberState) -> tuple[str, ...]:
        return tuple(t for t, m in self._members.items() if m.state in states)

    def job_over(self) -> str | None:
        """Why the job is over now, or None: the chief said done and no member still trains, or
        every member said failed (by an error, or stopped by SIGTERM: `shoal kill`)."""
        states = [m.state for m in self._members.values()]
        if any(s in LIVE for s in states):
            return None
        if self.chief is not None and self.state(self.chief) is MemberState.DONE:
            done = states.count(MemberState.DONE)
            if done == len(states):
                return f"{self._all(done)} finished"
            return f"the chief finished and no replica trains any more ({done} done, {len(states) - done} left)"
        if states and all(s is MemberState.FAILED for s in states):
            stopped = sum(m.terminated for m in self._members.values())
            if stopped == len(states):
                return f"{self._all(stopped)} {'was' if stopped == 1 else 'were'} stopped (SIGTERM)"
            if stopped:
                return f"{self._all(len(states))} left: {stopped} stopped (SIGTERM), {len(states) - stopped} failed"
            return f"{self._all(len(states))} failed"
        return None

    def describe(self) -> str:
        """E.g. "membership v3: 2 training [chief:0, worker:0]"."""
        live = self.training
        return f"membership v{self.version}: {len(live)} training [{', '.join(live)}]"

    # --- internals -------------------------------------------------------------------------

    def _all(self, replicas: int) -> str:
        """All `replicas` members, named as the user counts them: a chief task of its own is not
        one of the workers ("the chief and all 2 workers"); worker 0 as the chief is."""
        if self.chief is not None and self.chief in self._members and not self.chief.startswith("worker:"):
            workers = replicas - 1
            if workers == 0:
                return "the chief"
            return f"the chief and all {workers} workers" if workers != 1 else "the chief and its worker"
        return f"all {replicas} workers" if replicas != 1 else "the one worker"

    def _leave(self, task: str, state: MemberState, terminated: bool = False, why: str = "") -> Change | None:
        member = self._members.get(task)
        before = member.state if member is not None else None
        if before is state:
            return None
        self._members[task] = _Member(state, 0.0, terminated=terminated)
        return self._changed(Change(task, before, state, why, applied=self._applied.get(task, 0),
                                    terminated=terminated))

    def _changed(self, change: Change) -> Change:
        self.version += 1
        return change


def quorum(live: Iterable[str], backups: int) -> int:
    """The gradients a sync step aggregates: the live members minus the backups, at least 1."""
    return max(1, len(tuple(live)) - backups)
