"""Waiting for other tasks: the ps tasks coming up and the chief initializing them (at start),
and a lost ps coming back (`PsRecovery`, the PsClient's `on_lost` handler).

Every wait is bounded by a deadline and logs who is missing while it waits; every call blocks;
nothing here is thread-safe.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from shoal.ps.client import LostPsHandler, PsClient
from shoal.ps.protocol import Mode, StatusReply
from shoal.train.errors import TrainError
from shoal.train.waiting import LOG_EVERY_S, log_waiting, poll_until
from shoal.wire import PeerLostError, PeerTimeoutError, WireError
from shoal.wire.client import HEARTBEAT_TIMEOUT_MS

log = logging.getLogger("shoal.train.session")


def wait_for_ps(client: PsClient, task: str, deadline: float, total_s: float, *,
                log_every_s: float = LOG_EVERY_S,
                learn: Callable[[list[StatusReply | WireError]], bool] | None = None) -> list[StatusReply]:
    """Every ps's status, polling until all answer; logs which ps it still waits for every
    `log_every_s` ("worker:0 waiting for ps:1 at host:2222 (5s of 120s)"). While some do not
    answer, `learn(the poll's results)` may apply placement changes the others report (a ps
    re-homed meanwhile never answers again) and return True: the client then talks to other ps,
    and they are asked again at once."""
    missing: list[tuple[int, Exception]] = []

    def probe() -> list[StatusReply] | None:
        while True:
            results = client.status_each(min(2.0, log_every_s, max(0.1, deadline - time.monotonic())))
            missing[:] = [(i, r) for i, r in enumerate(results) if isinstance(r, WireError)]
            if not (missing and learn is not None and learn(results)):
                return None if missing else results  # type: ignore[return-value]

    def absent() -> str:
        return missing_ps(client, [i for i, _ in missing])

    def timed_out() -> Exception:
        why = str(missing[0][1]) if missing else "no answer"
        return TrainError(f"{task}: parameter servers did not come up within {total_s:g}s: no answer from "
                          f"{absent()} ({why}); start the ps tasks or fix --ps_hosts / TF_CONFIG")

    return poll_until(probe, deadline=deadline, interval_s=0.05, timed_out=timed_out, log_every_s=log_every_s,
                      waiting=log_waiting(log, lambda: f"{task} waiting for {absent()}", total_s, deadline))


def missing_ps(client: PsClient, indices: list[int]) -> str:
    """"ps:1 at host:2222, ps:2 at ...", or "the parameter servers" for none known."""
    return ", ".join(f"ps:{client.ps_id(i)} at {client.addresses[i]}" for i in indices) or "the parameter servers"


PROBE_TIMEOUT_S = 2.0
"""How long one poll of a wait for the ps waits for their answers (the next poll asks again)."""


SILENT_AS_LOST_S = HEARTBEAT_TIMEOUT_MS / 1000
"""How long a ps may leave every poll of the wait for the chief unanswered before it counts as
lost (as zmq's heartbeat decides in training): a machine that vanished sends no reset, and each
unanswered poll starts its connection again, so zmq's heartbeat never says so there."""


def wait_for_chief(client: PsClient, task: str, chief: str, deadline: float, total_s: float,
                   on_lost: LostPsHandler | None = None) -> list[StatusReply]:
    """Every ps's status, polling until the chief marked all of them ready. A ps whose
    connection is lost meanwhile (or that answered no poll for SILENT_AS_LOST_S) goes to
    `on_lost(client, ps, deadline, cause)` (the session's recovery strategy's
    `recover_before_start`, given the client's recovery timeout): it returns once the ps
    answers again, and the wait then lasts at least until that recovery deadline (the chief
    may need it to restore the ps); it raises PlacementChanged once the ps's shards were
    re-homed (the caller adopts the new placement and waits again), or TrainError. Each poll
    waits at most PROBE_TIMEOUT_S for the answers: a new connection to a ps that is gone never
    comes up, and would otherwise hold the wait for the whole request timeout."""
    log.info("%s waiting for the chief (%s) to initialize the variables", task, chief)

    unanswered: list[WireError] = []  # the last poll's errors
    silent_since: dict[int, float] = {}  # ps -> when it first left a poll unanswered (timeouts only)
    end = [deadline]  # the wait's deadline, moved past a lost ps's recovery deadline

    def probe() -> list[StatusReply] | None:
        results = client.status_each(min(client.timeout_s, PROBE_TIMEOUT_S))
        now = time.monotonic()
        unanswered[:] = [r for r in results if isinstance(r, WireError)]
        for ps in [ps for ps in silent_since if not isinstance(results[ps], PeerTimeoutError)]:
            del silent_since[ps]
        lost = _first_lost(client, results, silent_since, now)
        if lost is not None and on_lost is not None:
            ps, cause = lost
            recovery_deadline = now + client.recovery_timeout_s
            on_lost(client, ps, recovery_deadline, cause)  # blocks; raises PlacementChanged or TrainError
            end[0] = max(end[0], recovery_deadline)
            silent_since.clear()
            return None  # asked again: these answers are from before the wait
        if unanswered:
            return None
        return results if all(s.ready for s in results) else None  # type: ignore[union-attr]

    def timed_out() -> Exception:
        waited = total_s + max(0.0, end[0] - deadline)
        if unanswered:
            return TrainError(f"{task}: waited {waited:g}s for the chief ({chief}) to initialize the variables, and"
                              f" a ps stopped answering meanwhile: {unanswered[0]}; restart the ps task (the launcher"
                              " does with restart: {policy: on-failure})")
        return TrainError(f"{task}: the chief ({chief}) did not initialize the variables within {waited:g}s; "
                          "is it running? (raise init_timeout_s if it is slow)")

    return poll_until(probe, deadline=lambda: end[0], interval_s=0.2, timed_out=timed_out,
                      waiting=log_waiting(log, f"{task} still waiting for the chief ({chief})", total_s))


def _first_lost(client: PsClient, results: list[StatusReply | WireError], silent_since: dict[int, float],
                now: float) -> tuple[int, PeerLostError] | None:
    """The first ps of a poll's `results` that counts as lost (its connection broke, or it left
    every poll unanswered for SILENT_AS_LOST_S; `silent_since` records when it began), with
    the error that says so."""
    for ps, result in enumerate(results):
        if isinstance(result, PeerLostError):
            return ps, result
        if isinstance(result, PeerTimeoutError):
            since = silent_since.setdefault(ps, now)
            if now - since >= SILENT_AS_LOST_S:
                name = f"ps:{client.ps_id(ps)}"
                return ps, PeerLostError(f"{name} at {client.addresses[ps]} answered nothing for {now - since:.0f}s"
                                         " (its machine gone?)", name)
    return None


class PsRecovery:
    """Brings a lost ps back into training: waits until it answers again; on the chief,
    `rebuild(client, ps)` recreates its shards, on other workers it waits until it is ready.
    Raises TrainError at the deadline; `stop()`, called at each poll, may raise to end the wait
    (a session's SIGTERM: the process then stops at once, not when the launcher's SIGKILL comes)."""

    def __init__(self, task: str, chief: str, timeout_s: float,
                 rebuild: Callable[[PsClient, int], None] | None = None, *, stop: Callable[[], None] | None = None):
        self._task = task
        self._chief = chief
        self._timeout_s = timeout_s
        self._rebuild = rebuild
        self.stop = stop  # called at each poll of a wait; raises to end it (SIGTERM)

    def learn(self, client: PsClient, deadline: float) -> None:
        """At start, the ps tasks re-homed before this worker started: none, as this strategy
        never re-homes one (shoal/train/rehoming.py does). Does not block."""
        return None

    def recover_before_start(self, client: PsClient, ps: int, deadline: float, cause: Exception) -> None:
        """`wait_for_chief`'s `on_lost` (before this worker trains, so nothing to restore on its
        side): block until ps `ps` answers `status` again, ready or not (the chief may not have
        initialized it yet; the wait for the chief goes on). TrainError at `deadline`."""
        name, address = f"ps:{client.ps_id(ps)}", client.addresses[ps]
        log.warning("%s lost %s at %s while it waited for the chief (%s); waiting up to %.0fs for it to come back",
                    self._task, name, address, self._chief, max(0.0, deadline - time.monotonic()))

        def probe() -> bool | None:
            try:
                client.status(ps, timeout_s=PROBE_TIMEOUT_S)
                return True
            except WireError:
                return None

        def timed_out() -> Exception:
            error = TrainError(f"{self._task}: {cause}, while it waited for the chief ({self._chief}) to initialize "
                               f"the variables, and it did not come back within {self._timeout_s:g}s; restart the ps "
                               "task (the launcher does with restart: {policy: on-failure}) or raise "
                               "ps_recovery_timeout_s")
            error.__cause__ = cause
            return error

        poll_until(probe, deadline=deadline, interval_s=0.2, timed_out=timed_out, stop=self.stop,
                   waiting=log_waiting(log, f"{self._task} waiting for {name} at {address} to come back",
                                       self._timeout_s))
        log.info("%s: %s at %s answers again; it goes on waiting for the chief (%s)", self._task, name, address,
                 self._chief)

    def recover(self, client: PsClient, ps: int, deadline: float, cause: Exception,
                retired: Callable[[], bool] | None = None) -> bool:
        """The PsClient's `on_lost`: block until ps `ps` is ready again (True). With `retired`
        (asked at each poll, a worker other than the chief under re-homing): False as soon as it
        says the ps was re-homed — a process started again at its address after that is never
        restored, so waiting for it would fail."""
        name, address = f"ps:{client.ps_id(ps)}", client.addresses[ps]
        before = client.answered_step(ps)
        log.warning("%s lost %s at %s (%s); waiting up to %.0fs for it to come back", self._task, name, address,
                    cause, max(0.0, deadline - time.monotonic()))
        last: list[StatusReply | None] = [None]

        def probe() -> StatusReply | bool | None:
            if retired is not None and retired():
                return False
            try:
                status = client.status(ps, timeout_s=PROBE_TIMEOUT_S)
            except WireError:
                status = None
            last[0] = status
            if status is not None and not status.ready and self._rebuild is not None:
                self._rebuild(client, ps)
                return None
            return status if status is not None and status.ready else None

        def timed_out() -> Exception:
            waiting_for = (f"{name} at {address} did not come back" if last[0] is None else
                           f"{name} came back but the chief ({self._chief}) did not restore it")
            error = TrainError(f"{self._task}: {waiting_for} within {self._timeout_s:g}s; restart the ps task "
                               "(the launcher does with restart: {policy: on-failure}) or raise ps_recovery_timeout_s")
            error.__cause__ = cause
            return error

        def waiting_for() -> str:
            if last[0] is None:
                return f"{self._task} waiting for {name} at {address} to come back"
            return f"{self._task} waiting for the chief ({self._chief}) to restore {name} at {address}"

        status = poll_until(probe, deadline=deadline, interval_s=0.2, timed_out=timed_out,
                            waiting=log_waiting(log, waiting_for, self._timeout_s), stop=self.stop)
        if status is False:
            return False
        client.set_incarnation(ps, status.incarnation)
        rolled_back = ""
        if before is not None and status.training is not None and status.training.mode is Mode.ASYNC:
            # The step it answers from depends on how the chief restored it (a replica's own
            # step, or the newest step around for a checkpoint), so this worker cannot count the
            # updates lost: the chief's log says what the restore came from and what it lost.
            rolled_back = (f" (it had answered step {before} before it was lost; the chief's log says what its"
                           " restore lost)")
        log.info("%s: %s is back at step %d%s", self._task, name, status.step, rolled_back)
        return True
