"""`PsClient`: a worker's client of every ps task of one job, one method per op (as ps-lite
keeps `KVWorker` beside `KVServer`).

Requests to several ps tasks go out together and are awaited together, each bounded by the
request timeout. If a ps is lost meanwhile (its connection dropped, or it answers as a new
process), the `on_lost` handler given at construction waits for it to come back (and, on the
chief, rebuilds it); then whatever went to that ps is sent again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Sequence

import numpy as np

from shoal.ps.errors import ShardsMoved
from shoal.ps.protocol import AdoptReply, AdoptRequest, PlaceRequest, ReleaseRequest
from shoal.ps.protocol import (REPLY_TYPES, ClosureTag, DoneRequest, FailedRequest, Hyper, InitReply, InitRequest,
                               LeaseReply, LeaseRequest, Op, PullRequest, PushRequest, ReadyRequest, ReplicaRequest,
                               ShutdownRequest, SnapshotRequest, StatusReply, StatusRequest, UsedPositions)
from shoal.wire import (JobSecret, Message, PeerLostError, PeerTimeoutError, RemoteError, RpcClient, Security, WireError,
                        wait_all)

Tensors = Mapping[str, np.ndarray]
LostPsHandler = Callable[["PsClient", int, float, Exception], None]
"""on_lost(client, ps, deadline, cause): block until ps `ps` serves again, or raise."""
SlowWaitHandler = Callable[["PsClient", Op, tuple[int, ...], float], None]
"""on_slow(client, op, ps still to answer, seconds waited): called every `slow_every_s` while a
request to every ps waits (a sync push waits for its step); may use `probe_status`."""


@dataclass(frozen=True)
class SentRequests:
    """Requests to some ps tasks, queued by one PsClient call; `wait()` once for their answers."""

    client: "PsClient"
    sent: list  # (ps, request, header fields, tensors) per request
    rids: list[int]
    into: Tensors | None

    def wait(self) -> list[Answer]:
        """Per request, in order: its answer. A lost ps is recovered and what went to it is sent
        again (see PsClient). Blocks."""
        return self.client._collect(self.sent, self.rids, self.into)


@dataclass(frozen=True)
class Answer:
    """A decoded reply: its typed fields and the tensors that came with it."""

    body: Any
    tensors: dict[str, np.ndarray]


class PsClient:
    """Talks to ps 0..n-1 of a job. Every call blocks, bounded by `timeout_s` (or its own
    `timeout_s`); not thread-safe (one per thread). The constructor does no I/O: connections
    open on first use. `close` is idempotent.

    `on_lost` recovers a lost ps (see module docstring) within `recovery_timeout_s`; without
    it a lost ps raises PeerLostError. `timeout_error` turns a PeerTimeoutError into the error
    to raise (the session adds what the user can do about it). `on_slow` is told every
    `slow_every_s` while a request to every ps waits for its replies. `security` is the wire's
    (shoal/wire/security.py; AUTO: PLAIN to loopback addresses, CURVE otherwise); every ps of
    the job must resolve the same. `shared_memory`: big requests to a ps on this host (loopback,
    or an address of its own) travel through shared memory once it accepts (RpcClient).
    """

    def __init__(self, addresses: Sequence[str], secret: JobSecret, *, timeout_s: float,
                 on_lost: LostPsHandler | None = None, recovery_timeout_s: float = 120.0,
                 timeout_error: Callable[[PeerTimeoutError], Exception] | None = None,
                 on_slow: SlowWaitHandler | None = None, slow_every_s: float = 5.0,
                 security: Security = Security.AUTO, shared_memory: bool = True):
        self.addresses = tuple(addresses)
        self.ring = len(self.addresses)  # the replica ring: ps k -> ps (k + 1) % ring, by cluster index
        self.timeout_s = timeout_s
        self._rpc = [RpcClient(address, secret, f"ps:{i}", timeout_s, security=security, shared_memory=shared_memory)
                     for i, address in enumerate(self.addresses)]
        self._on_lost = on_lost
        self._recovery_timeout_s = recovery_timeout_s
        self._timeout_error = timeout_error
        self._on_slow = on_slow
        self._slow_every_s = slow_every_s
        self._secret = secret
        self._security = security
        self._shared_memory = shared_memory
        self._probes: dict[int, RpcClient] = {}  # second connections, for status while a request waits
        self._incarnations: list[str | None] = [None] * len(self._rpc)
        self._answered_step: list[int | None] = [None] * len(self._rpc)
        self._ids = list(range(len(self._rpc)))  # each ps's index in the cluster (they differ after `drop`)

    @property
    def num_ps(self) -> int:
        return len(self._rpc)

    @property
    def recovery_timeout_s(self) -> float:
        """How long `on_lost` may bring a lost ps back (its deadline, from the loss)."""
        return self._recovery_timeout_s

    def ps_id(self, ps: int) -> int:
        """The cluster index of this client's ps `ps` (the same until a ps was dropped)."""
        return self._ids[ps]

    def drop(self, ps: int) -> None:
        """Stop talking to ps `ps`, whose shards were re-homed (shoal/train/rehoming.py): its
        connections close, and this client's ps k > `ps` are its ps k - 1 from now on (as the
        re-homed placement numbers them). Replies still awaited from other ps by a request given
        up on are never read. Does not block; not while a request of this client waits."""
        if self.num_ps < 2:
            raise ValueError(f"cannot drop ps:{self._ids[ps]}: it is the only ps this client talks to")
        self._rpc.pop(ps).close()
        probe = self._probes.pop(ps, None)
        if probe is not None:
            probe.close()
        self._probes = {k - (k > ps): rpc for k, rpc in self._probes.items()}
        for per_ps in (self._incarnations, self._answered_step, self._ids):
            del per_ps[ps]
        self.addresses = self.addresses[:ps] + self.addresses[ps + 1:]

    def add(self, address: str, cluster_id: int) -> int:
        """Talk to one more ps, cluster ps `cluster_id` at `address`, which joined the job
        (shoal/train/growing.py): it is this client's ps `num_ps` (the last), as the grown placement
        numbers it. The inverse of `drop`. Returns its index. Does not block (connections open on
        first use); not while a request of this client waits."""
        if cluster_id in self._ids:
            raise ValueError(f"ps:{cluster_id} is already one of this client's ps (at {self.addresses[self._ids.index(cluster_id)]})")
        self._rpc.append(RpcClient(address, self._secret, f"ps:{cluster_id}", self.timeout_s, security=self._security,
                                   shared_memory=self._shared_memory))
        self._incarnations.append(None)
        self._answered_step.append(None)
        self._ids.append(cluster_id)
        self.addresses = (*self.addresses, address)
        return len(self._rpc) - 1

    def close(self) -> None:
        """Close every connection. Idempotent."""
        for rpc in [*self._rpc, *self._probes.values()]:
            rpc.close()

    # --- one ps at a time (no recovery: these are what recovery itself uses) ---------------

    def status(self, ps: int, timeout_s: float) -> StatusReply:
        return self._one(ps, StatusRequest(), None, timeout_s).body

    def probe_status(self, ps: int, timeout_s: float) -> StatusReply:
        """ps `ps`'s status over a second connection, opened on first use, so it can be asked
        while a request on the main one waits (from `on_slow`, or after a timeout). Raises
        WireError."""
        return StatusReply.decode(self._probe(ps, timeout_s).call(Op.STATUS.value, timeout_s=timeout_s).header)

    def _probe(self, ps: int, timeout_s: float) -> RpcClient:
        probe = self._probes.get(ps)
        if probe is None:
            probe = self._probes[ps] = RpcClient(self.addresses[ps], self._secret, f"ps:{self._ids[ps]}", timeout_s,
                                                 security=self._security)
        return probe

    def init(self, ps: int, request: InitRequest, tensors: Tensors) -> InitReply:
        return self._one(ps, request, tensors, self.timeout_s).body

    def ready(self, ps: int) -> None:
        self._one(ps, ReadyRequest(), None, self.timeout_s)

    def replica(self, holder: int, source: int, timeout_s: float) -> Answer:
        """The replica of ps `source`'s shards (its cluster index) that ps `holder` holds: ReplicaReply and, if
        present, its values and "<shard>@<slot>" state. Asked over the second connection (as
        `probe_status`), so a request of this client still waiting on `holder` is not disturbed
        (the chief asks while recovering another ps). No recovery; raises WireError."""
        request = ReplicaRequest(source)
        return _answer(request.op, self._probe(holder, timeout_s).call(request.op.value, request.fields(),
                                                                       timeout_s=timeout_s))

    def adopt(self, ps: int, request: AdoptRequest, tensors: Tensors) -> AdoptReply:
        """Give ps `ps` shards of a ps that never came back (re-homing). No recovery; raises
        WireError. Blocks."""
        return self._one(ps, request, tensors, self.timeout_s).body

    def release(self, ps: int, request: ReleaseRequest) -> Answer:
        """Make ps `ps` hand over shards that move to a ps that joined: ReleaseReply and their
        values and "<shard>@<slot>" state. No recovery; raises WireError. Blocks."""
        return self._one(ps, request, None, self.timeout_s)

    def place(self, ps: int, request: PlaceRequest) -> None:
        """Tell ps `ps` the job's placement history. No recovery; raises WireError. Blocks."""
        self._one(ps, request, None, self.timeout_s)

    def answered_step(self, ps: int) -> int | None:
        """The step ps `ps` answered this client's last push or pull with (None before any)."""
        return self._answered_step[ps]

    # --- every ps ----------------------------------------------------------------------------

    def status_all(self, timeout_s: float) -> list[StatusReply]:
        """Every ps's status, or the first error (PeerTimeoutError, PeerLostError, ...)."""
        replies = wait_all([(rpc, rpc.send(Op.STATUS.value)) for rpc in self._rpc], timeout_s)
        return [StatusReply.decode(m.header) for m in replies]

    def status_each(self, timeout_s: float) -> list[StatusReply | WireError]:
        """Every ps's status, or, for a ps that did not answer within `timeout_s` (all waits
        together), the PeerTimeoutError or PeerLostError that says so; a refusal
        (AuthRejectedError, RemoteError) is raised. Blocks up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        rids = [rpc.send(Op.STATUS.value) for rpc in self._rpc]
        results: list[StatusReply | WireError] = []
        for rpc, rid in zip(self._rpc, rids):
            try:
                results.append(StatusReply.decode(rpc.wait(rid, max(0.01, deadline - time.monotonic())).header))
            except (PeerTimeoutError, PeerLostError) as e:
                results.append(e)
        return results

    def remember_incarnations(self, statuses: Sequence[StatusReply]) -> None:
        """The ps processes this client trains with; a ps answering as another one restarted."""
        self._incarnations = [s.incarnation for s in statuses]

    def set_incarnation(self, ps: int, incarnation: str) -> None:
        self._incarnations[ps] = incarnation

    def restarted(self, ps: int) -> bool:
        """Whether ps `ps` is gone or answers as another process than the remembered one."""
        try:
            return self.status(ps, 2.0).incarnation != self._incarnations[ps]
        except WireError:
            return True

    def init_all(self, request: InitRequest, tensors: Sequence[Tensors]) -> list[InitReply]:
        return [a.body for a in self._all([(i, request, tensors[i]) for i in range(self.num_ps)])]

    def ready_all(self) -> None:
        self._all([(i, ReadyRequest(), None) for i in range(self.num_ps)])

    def snapshot_all(self, ps_indices: Sequence[int] | None = None) -> list[Answer]:
        """Per ps of `ps_indices` (default: every ps), in that order: SnapshotReply and copies
        of its values and "<shard>@<slot>" state. Blocks."""
        asked = range(self.num_ps) if ps_indices is None else ps_indices
        return self._all([(i, SnapshotRequest(), None) for i in asked])

    def pull_all(self, names: Sequence[Sequence[str]], min_step: int, into: Tensors) -> list[Answer]:
        """Per ps that `names` gives any name (`names[ps]`), in ps order: PullReply and the
        values of `names[ps]`, once that ps reached `min_step`. A ps given none (it holds none of
        the model: more ps than shards) is not asked, so one that died costs the pull nothing.
        Values whose name is in `into` are written straight into those arrays. Blocks."""
        requests = [(i, PullRequest(tuple(names[i]), min_step), None) for i in range(self.num_ps) if names[i]]
        return self._all(requests, into)

    def push_all(self, task: str, step: int, parts: Sequence[tuple[int, Tensors]], into: Tensors,
                 hyper: Mapping[str, Hyper] | None = None, used: UsedPositions | None = None, *,
                 closure: ClosureTag | None = None, empty: bool = False) -> list[Answer]:
        """`send_push(...).wait()`: send a push and wait for its answers. Blocks."""
        return self.send_push(task, step, parts, into, hyper, used, closure=closure, empty=empty).wait()

    def send_push(self, task: str, step: int, parts: Sequence[tuple[int, Tensors]], into: Tensors,
                  hyper: Mapping[str, Hyper] | None = None, used: UsedPositions | None = None, *,
                  closure: ClosureTag | None = None, empty: bool = False) -> "SentRequests":
        """Send a push in `parts` ((ps, gradients of some of its shards), each ps's parts in
        order; see `Placement.push_parts`). All parts are sent before any reply is awaited,
        so a ps updates and answers one part while the next is on its way. Per part:
        PushReply and the new values of its shards (written into `into`). `hyper` (shard ->
        Hyper, every pushed shard), if given, travels with each part for its shards. `used` (the
        leased positions the gradient was computed on), if given, travels with the last part
        sent to ps 0, which counts them. Each part names the incarnation of its ps that the
        gradient was computed against (`basis`): resent to a restarted ps after recovery, it is
        dropped as ROLLED_BACK, never applied on top of restored values that may hold it.
        `closure` (the scheduled closure and push this gradient belongs to), if given, travels
        with every part: a ps applies it at most once. `empty` (sync): the gradients are zeros
        standing for no data for this step (PushRequest.empty). Returns once every part is
        queued (blocks only while zmq has no room); `wait()` on the result for the answers.
        Other requests may go out and be answered meanwhile."""
        last = {ps: k for k, (ps, _) in enumerate(parts)}
        used_at = last[0] if used is not None else -1
        # one request object per part, built once (a push of many parts pays this per part)
        requests = [(ps, PushRequest(task, step, ends_step=last[ps] == k,
                                     hyper=None if hyper is None else {n: hyper[n] for n in grads},
                                     used=used if k == used_at else None, basis=self._incarnations[ps] or "",
                                     closure=closure, empty=empty), grads)
                    for k, (ps, grads) in enumerate(parts)]
        return self._send(requests, into)

    def lease(self, request: LeaseRequest) -> LeaseReply:
        """Ask ps 0 for leased positions (a lost ps 0 is recovered as for any request). Blocks."""
        return self._all([(0, request, None)])[0].body

    def done_all(self, task: str, timeout_s: float) -> None:
        """Tell every ps that `task` finished training (no recovery; raises WireError)."""
        fields = DoneRequest(task).fields()
        wait_all([(rpc, rpc.send(Op.DONE.value, fields)) for rpc in self._rpc], timeout_s)

    def failed_all(self, task: str, timeout_s: float, incarnation: str = "", terminated: bool = False,
                   started: bool = True) -> None:
        """Tell every ps that `task` (its heartbeats' `incarnation`) left training by an error,
        or, `terminated`, was stopped by SIGTERM, or, not `started`, that its start failed (no
        recovery; raises WireError)."""
        fields = FailedRequest(task, incarnation, terminated, started).fields()
        wait_all([(rpc, rpc.send(Op.FAILED.value, fields)) for rpc in self._rpc], timeout_s)

    def shutdown_all(self, task: str, timeout_s: float) -> None:
        """Stop every ps now (no recovery; raises WireError)."""
        fields = ShutdownRequest(task).fields()
        wait_all([(rpc, rpc.send(Op.SHUTDOWN.value, fields)) for rpc in self._rpc], timeout_s)

    # --- internals ---------------------------------------------------------------------------

    def _one(self, ps: int, request, tensors: Tensors | None, timeout_s: float) -> Answer:
        rpc = self._rpc[ps]
        return _answer(request.op, rpc.call(request.op.value, request.fields(), tensors, timeout_s))

    def _all(self, requests: list[tuple[int, Any, Tensors | None]], into: Tensors | None = None) -> list[Answer]:
        """Send (ps, request, tensors) and wait for every reply. A lost ps is recovered (see
        the class docstring) and what went to it is sent again. Blocks."""
        return self._send(requests, into).wait()

    def _send(self, requests: list[tuple[int, Any, Tensors | None]], into: Tensors | None) -> "SentRequests":
        """Queue (ps, request, tensors) for `SentRequests.wait`. Blocks only while zmq has no room."""
        fields_of: dict[int, dict] = {}  # one header dict per request, however many ps it goes to
        for _, request, _ in requests:
            if id(request) not in fields_of:
                fields_of[id(request)] = request.fields()
        sent = [(ps, request, fields_of[id(request)], tensors) for ps, request, tensors in requests]
        try:
            rids = [self._rpc[ps].send(request.op.value, fields, tensors, into) for ps, request, fields, tensors in sent]
        except PeerTimeoutError as e:  # zmq had no room to queue one for the timeout
            self._raise_timeout(e)
        return SentRequests(self, sent, rids, into)

    def _collect(self, sent: list, rids: list[int], into: Tensors | None) -> list[Answer]:
        """Wait for the replies to what `_send` sent, recovering a lost ps and sending again
        what went to it. Blocks."""
        deadline = None
        progress = self._progress(sent[0][1].op) if self._on_slow is not None else None
        while True:
            try:
                replies = wait_all([(self._rpc[s[0]], rid) for s, rid in zip(sent, rids)], self.timeout_s,
                                   progress=progress, progress_every_s=self._slow_every_s)
                answers = [_answer(s[1].op, m) for s, m in zip(sent, replies)]
                moved: dict[int, tuple[str, ...]] = {}
                moved_parts = []
                for k, (s, a) in enumerate(zip(sent, answers)):
                    if s[1].op in (Op.PUSH, Op.PULL):
                        if a.body.moved:
                            moved[s[0]] = (*moved.get(s[0], ()), *a.body.moved)
                            moved_parts.append(k)
                            continue
                        self._answered_step[s[0]] = a.body.step
                        self._adopt_incarnation(s[0], a.body.incarnation)
                if moved:
                    raise ShardsMoved("shards moved to a ps that joined: " + "; ".join(
                        f"ps:{self._ids[ps]} released {', '.join(names[:3])}" for ps, names in moved.items()), moved,
                        tuple(moved_parts))
                return answers
            except PeerTimeoutError as e:
                self._raise_timeout(e)
            except (PeerLostError, RemoteError) as e:
                lost = self.index_of(e.peer_name)
                if lost is None or self._on_lost is None or self._incarnations[lost] is None or (
                        isinstance(e, RemoteError) and not self.restarted(lost)):
                    raise
                deadline = deadline or time.monotonic() + self._recovery_timeout_s
                if isinstance(e, RemoteError):  # the new process refused: drop the old connection's
                    self._rpc[lost].reset()     # unread events, which would fail a later request
                self._on_lost(self, lost, deadline, e)
                for k, (ps, request, fields, tensors) in enumerate(sent):
                    if ps == lost:
                        rids[k] = self._rpc[ps].send(request.op.value, fields, tensors, into)

    def _raise_timeout(self, e: PeerTimeoutError) -> NoReturn:
        """Raise `e`, or what the session's `timeout_error` makes of it (it says what to do)."""
        if self._timeout_error is None:
            raise e
        raise self._timeout_error(e) from e

    def _adopt_incarnation(self, ps: int, incarnation: str) -> None:
        """A push or pull reply carried values of ps process `incarnation`: this worker's next
        gradients for that ps are computed on them. A worker that never saw the ps restart (its
        connection dropped while it had no request there, and zmq reconnected) learns of the new
        process here; its one push computed on the old values was answered ROLLED_BACK."""
        if incarnation and self._incarnations[ps] is not None:
            self._incarnations[ps] = incarnation

    def _progress(self, op: Op) -> Callable[[float, Sequence[str]], None]:
        def progress(waited: float, peers: Sequence[str]) -> None:
            pending = tuple(i for i, rpc in enumerate(self._rpc) if rpc.peer_name in peers)
            self._on_slow(self, op, pending, waited)
        return progress

    def index_of(self, peer_name: str) -> int | None:
        """This client's index of the ps a WireError's `peer_name` names ("ps:1"), or None."""
        for i, rpc in enumerate(self._rpc):
            if rpc.peer_name == peer_name:
                return i
        return None


def _answer(op: Op, message: Message) -> Answer:
    return Answer(REPLY_TYPES[op].decode(message.header), message.tensors)

