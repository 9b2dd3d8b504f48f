"""`IdlePsRestarts`: the chief makes a restarted ps that holds no shard ready again.

A training chief learns that a ps restarted from its own pushes: the push fails, or meets a ps
that is not initialized, and the chief rebuilds it (shoal/train/recovery.py). A ps that holds
no shard (more ps than the placement uses: the seed job's softmax is one request per step, to
ps 0) gets no push, so once restarted it stayed uninitialized, and a worker that started after
that (restarted by the launcher, say) waited for the chief to initialize it until its
`init_timeout_s`, then failed.

The chief's heartbeats reach every ps: a restarted one counts the chief as joining again
(`Heartbeats.take_rejoined`). After each step the chief asks each such ps that holds no shard
for its status and, if it is not ready, initializes it with nothing (at the others' step, with
their membership) and marks it ready, as its recovery does for such a ps.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Callable

from shoal.ps.client import PsClient
from shoal.ps.protocol import StatusReply
from shoal.train.placement import Placement
from shoal.wire import PeerLostError, WireError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long the status of a ps that just answered a heartbeat may take."""

REBUILD_RETRIES = 2
"""How many more times (at the chief's next steps) the chief makes ready a restarted ps whose
status answered but whose initialization counted as lost. The first can meet the chief's own
connection to it still catching up with the restart: the request then counts as lost (CI saw it
under load; see `RpcClient._judge_the_connection_first`), and the next goes over a new one."""


class IdlePsRestarts:
    """Chief only. `check(client, placement)` after each step: cheap when no ps counted the
    chief as joining again; otherwise, per such ps that holds no shard, one status round trip
    (at most PROBE_TIMEOUT_S), plus its initialization when it restarted. Blocks that long; the
    session's thread only.

    A ps that does not answer the status is left: it died again, and a process started there
    later counts the chief as joining again, which brings it back here. So a ps that keeps dying
    costs the chief one probe per restart, never one per step. One that answers but whose
    initialization counted as lost is tried again at the next step, REBUILD_RETRIES times.

    `rejoined()` returns (and forgets) the addresses of the ps that counted this replica as
    joining again; `rebuild(client, ps)` initializes a restarted ps (ChiefDuties.rebuild_ps);
    `serialize` is held around the probe and the rebuild (the session's recovery lock: a ps
    watch may rebuild too).
    """

    def __init__(self, task: str, rejoined: Callable[[], frozenset[str]],
                 rebuild: Callable[[PsClient, int], None], serialize: AbstractContextManager) -> None:
        self._task = task
        self._rejoined = rejoined
        self._rebuild = rebuild
        self._serialize = serialize
        self._retries: dict[str, int] = {}  # address -> the retries made so far, of a rebuild that failed

    def check(self, client: PsClient, placement: Placement) -> None:
        """Make ready each ps that holds no shard, counted the chief as joining again (or whose
        rebuild failed at an earlier check), and is not ready (it restarted). Never raises for a
        ps that fails meanwhile (logged)."""
        rejoined = self._rejoined()
        if not rejoined and not self._retries:
            return
        retries, self._retries = self._retries, {}
        for ps, address in enumerate(client.addresses):
            if (address not in rejoined and address not in retries) or ps == 0 or placement.on_ps(ps):
                continue  # ps 0 holds the lease book; a ps that holds shards learns of its restart from the pushes
            made = 0 if address in rejoined else retries[address]
            with self._serialize:
                status = self._make_ready(client, ps, address, made)
            if status is not None:
                client.set_incarnation(ps, status.incarnation)

    def _make_ready(self, client: PsClient, ps: int, address: str, made: int) -> StatusReply | None:
        """Probe ps `ps` and rebuild it if it is not ready; its status, None if it failed."""
        name = f"ps:{client.ps_id(ps)}"
        try:
            status = client.probe_status(ps, timeout_s=PROBE_TIMEOUT_S)
        except WireError as e:
            log.warning("%s: %s at %s restarted and holds no variables, but did not answer before it was made "
                        "ready (%s); a process started there again will be (nothing of training is lost with it)",
                        self._task, name, address, e)
            return None
        if status.ready:
            return status  # it had dropped the chief for a missed heartbeat, and serves on
        try:
            self._rebuild(client, ps)
        except WireError as e:
            if made < REBUILD_RETRIES and isinstance(e, PeerLostError):  # (a refusal or a timeout would recur)
                log.info("%s: making %s at %s ready failed (%s); trying again at the next step", self._task, name,
                         address, e)
                self._retries[address] = made + 1
            else:
                log.warning("%s: %s at %s restarted and holds no variables, but failed %s before it was made ready "
                            "(%s); a process started there again will be (nothing of training is lost with it)",
                            self._task, name, address, "once" if made == 0 else f"{made + 1} times", e)
            return None
        return status
