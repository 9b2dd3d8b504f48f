"""`StallReporter`: what a worker's request to the ps tasks waits for, said while it waits and
in the error when it times out.

In sync mode a push is answered when its step completes, so a replica that never pushes
leaves every other worker waiting. The ps knows which replicas are missing (its status reply's
`sync_*` fields, shoal/ps/sync_wait.py); the reporter asks it over a second connection
(`PsClient.probe_status`) and names them: "worker:0 waiting for worker:1: ps:0: step 12 waits
for 1 more gradient, from worker:1 (has worker:0's) (10s of 60s)", and at the request timeout
an error that names worker:1 instead of blaming the ps.

Every call blocks (each probe up to `probe_timeout_s`); not thread-safe (the session's thread).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

from shoal.ps.client import PsClient
from shoal.ps.protocol import Mode, Op, TrainingMode
from shoal.ps.sync_wait import SyncWait
from shoal.train.errors import TrainError
from shoal.wire import PeerTimeoutError, WireError

log = logging.getLogger("shoal.train.session")

PROBE_TIMEOUT_S = 2.0


class StallReporter:
    """The PsClient's `on_slow` and `timeout_error` for one session: `task` is this replica,
    `training` the session's mode, `timeout_s` the request timeout (for "Ns of Ms")."""

    def __init__(self, task: str, training: TrainingMode, timeout_s: float, *,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.task = task
        self.training = training
        self.timeout_s = timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.client: PsClient | None = None  # set once the session built its PsClient

    def on_slow(self, client: PsClient, op: Op, pending: tuple[int, ...], waited: float) -> None:
        """Log what the request still waits for (PsClient's on_slow)."""
        waits, silent = self._ask(client, pending)
        if waits:
            missing = sorted({m for _, w in waits for m in w.missing})
            who = f" for {', '.join(missing)}" if missing else ""
            what = f"{who}: " + "; ".join(f"{ps}: {w.describe()}" for ps, w in _grouped(waits))
        else:
            what = " for " + ", ".join(f"ps:{i} at {client.addresses[i]} to answer {op.value!r}" for i in pending)
        if silent:
            what += f" ({', '.join(f'ps:{i}' for i in silent)} does not answer 'status' either)"
        log.info("%s waiting%s (%.0fs of %.0fs)", self.task, what, waited, self.timeout_s)

    def timeout_error(self, error: PeerTimeoutError) -> Exception:
        """The error a timed-out request raises (PsClient's timeout_error): names the replicas
        a sync step waits for when the ps says so."""
        sync = self.training.mode is Mode.SYNC
        hint = (f" In sync mode a step waits for {self.training.replicas} replicas: if a worker may be down, use "
                "backup workers (replicas_to_aggregate < replicas)." if sync else "")
        waits = self._ask(self.client, tuple(range(self.client.num_ps)))[0] if sync and self.client else []
        missing = sorted({m for _, w in waits for m in w.missing})
        if not missing:
            return TrainError(f"{self.task}: {error}.{hint}")
        detail = "; ".join(f"{ps}: {w.describe()}" for ps, w in _grouped(waits))
        return TrainError(f"{self.task}: a sync step did not complete within {self.timeout_s:g}s waiting for "
                          f"{', '.join(missing)} ({detail}); is {' / '.join(missing)} running?{hint} "
                          f"(the request: {error})")

    def _ask(self, client: PsClient, pending: Sequence[int]) -> tuple[list[tuple[int, SyncWait]], list[int]]:
        """(ps, what its sync step waits for) of each pending ps whose step waits, and the ps
        that did not answer. Blocks up to probe_timeout_s in all."""
        deadline = time.monotonic() + self.probe_timeout_s
        waits, silent = [], []
        for ps in pending:
            try:
                status = client.probe_status(ps, max(0.1, deadline - time.monotonic()))
            except WireError:
                silent.append(ps)
                continue
            wait = status.sync_wait
            if wait is not None and wait.waiting:
                waits.append((ps, wait))
        return waits, silent


def _grouped(waits: list[tuple[int, SyncWait]]) -> list[tuple[str, SyncWait]]:
    """ps tasks whose steps wait for the same thing, together: [("ps:0, ps:1", wait)]."""
    groups: dict[SyncWait, list[int]] = {}
    for ps, wait in waits:
        groups.setdefault(wait, []).append(ps)
    return [(", ".join(f"ps:{i}" for i in ps_list), wait) for wait, ps_list in groups.items()]
