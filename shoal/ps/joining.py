"""`Joiner`: a ps task other than ps 0 tells ps 0 where it serves (`join`), once, from a thread.

This is how a ps added to a running job is found (issue 14): it is started with a cluster that
lists every ps ever used plus its own address at its index, the other tasks' clusters do not
list it, so it registers with ps 0, and the chief reads ps 0's registry in `status` and moves
shards onto it (shoal/train/growing.py). Every ps with an index > 0 registers, the original ones
too (harmless: they are in the placement already).

The join is retried every `every_s` until ps 0 answers, for at most `give_up_s`; a refusal (ps 0
says the index collides with a registered ps, or its registry is full) is logged as an error and
not retried. Never stops the ps from serving.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from shoal.ps.protocol import JoinReply, JoinRequest, Op
from shoal.wire import JobSecret, PeerLostError, PeerTimeoutError, RpcClient, Security, WireError

log = logging.getLogger(__name__)

DEFAULT_GIVE_UP_S = 600.0


class Joiner:
    """Registers ps `index` at `address` with ps 0 at `ps0_address`. `start()` starts the thread
    (no I/O in the constructor) and returns at once; `close()` stops it within `every_s` and is
    idempotent. `on_joined(reply)` runs on the joiner's thread once ps 0 answered. `joined` (a
    threading.Event) is set then. Thread-safe."""

    def __init__(self, index: int, address: str, ps0_address: str, secret: JobSecret, *,
                 on_joined: Callable[[JoinReply], None] | None = None, security: Security = Security.AUTO,
                 every_s: float = 0.5, give_up_s: float = DEFAULT_GIVE_UP_S):
        self.request = JoinRequest(index, address)
        self._ps0_address = ps0_address
        self._secret = secret
        self._security = security
        self._on_joined = on_joined
        self._every_s = every_s
        self._give_up_s = give_up_s
        self._stop = threading.Event()
        self.joined = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Joiner":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"shoal-join-ps{self.request.index}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._every_s + 1.0)

    def _run(self) -> None:
        deadline = time.monotonic() + self._give_up_s
        rpc = RpcClient(self._ps0_address, self._secret, "ps:0", self._every_s * 4, security=self._security)
        try:
            while not self._stop.is_set():
                try:
                    message = rpc.call(Op.JOIN.value, self.request.fields(), timeout_s=self._every_s * 4)
                except (PeerTimeoutError, PeerLostError):
                    if time.monotonic() > deadline:
                        log.error("ps:%d could not register with ps:0 at %s within %.0fs; a chief will not move "
                                  "shards onto it (is ps:0 running?)", self.request.index, self._ps0_address,
                                  self._give_up_s)
                        return
                    self._stop.wait(self._every_s)
                    continue
                except WireError as e:
                    log.error("ps:%d: ps:0 refused its registration: %s", self.request.index, e)
                    return
                reply = JoinReply.decode(message.header)
                log.info("ps:%d registered with ps:0 at %s (%d registered)", self.request.index,
                         self._ps0_address, reply.registered)
                self.joined.set()
                if self._on_joined is not None:
                    self._on_joined(reply)
                return
        finally:
            rpc.close()
