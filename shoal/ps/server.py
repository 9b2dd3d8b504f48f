"""shoal.Server: a parameter-server task that serves until the job is over, then returns."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping, Optional

import shoal.sigterm as sigterm

from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
from shoal.logs_default import show_shoal_logs
from shoal.ps.draining import TermDrain
from shoal.ps.errors import PsError
from shoal.ps.joining import Joiner
from shoal.ps.protocol import JoinReply, Op
from shoal.ps.replicator import ReplicationOptions, Replicator
from shoal.ps.ring import joined_address, ring_members, ring_predecessor, ring_successor
from shoal.ps.service import PsService
from shoal.wire import JobSecret, Request, RpcServer, Security
from shoal.wire.bad_requests import ERROR_TEXT_MAX, bounded
from shoal.wire.memory import keep_freed_memory, share_main_arena

log = logging.getLogger(__name__)

CHORES_EVERY_S = 0.01  # between requests, heartbeat expiry, replication and drain checks run at least this often
_HEARTBEAT = Op.HEARTBEAT.value  # (read per request: an Enum member's `.value` is a descriptor call)


class ServerFailed(SystemExit):
    """`join()` ends with this when the serving thread failed (a bug: a bad request is answered,
    never fatal). A SystemExit: uncaught, the program prints why and exits with status 1, so
    the launcher and a restart policy see a failed ps, not a finished one."""

    def __init__(self, task: str, why: str) -> None:
        super().__init__(f"{task}: its serving thread failed, so this ps stops: {why}")


class ServerTerminated(SystemExit):
    """`join()` ends with this after SIGTERM cut the job short, once the training replicas no
    longer need the ps (shoal/ps/draining.py); after a job whose replicas all finished, `join()`
    returns as usual even if SIGTERM came. A SystemExit: uncaught, the program exits with status
    143 (128 + SIGTERM), as a shell reports SIGTERM, and no traceback."""

    def __init__(self, task: str, reason: str) -> None:
        super().__init__(sigterm.EXIT_STATUS)
        self.task = task
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.task} stopped: {self.reason}"


class Server:
    """Hosts this ps task's share of the variables and serves pulls and pushes.

    Unlike TensorFlow's `server.join()`, `join()` returns when the job is over: when the chief
    said it is done and no other training replica still trains (workers join and leave at any
    time: shoal/ps/membership.py), or one ended the job.

    SIGTERM while `join()` runs on the main thread (`shoal kill`, a deadline, preemption) does
    not end the process at once: the ps keeps serving until the training replicas, which stop
    at their next step boundary, no longer need it — the chief snapshots it for a final
    checkpoint — then `join()` raises ServerTerminated (exit status 143; it returns as usual if
    every replica had finished anyway). A second SIGTERM ends the process at once. See
    shoal/ps/draining.py.

    `secret` is the job's shared secret, resolved at the program's edge
    (`shoal.resolve_job_secret(os.environ)`). `start()` binds (raising BindError at once if the
    port is taken) and serves on a background thread; `join()` blocks; `stop()` is idempotent
    and safe in `finally`. `security` is the wire's (shoal/wire/security.py; AUTO: PLAIN on a
    loopback address, CURVE otherwise); the job's workers must resolve the same.

    `replication` (default: off) makes this ps send a copy of its shards to the next ps of the
    ring at its intervals, and a ps restarted after a crash is then rebuilt by the chief from that
    copy rather than the older checkpoint (docs/checkpoints.md). The ring is the live ps of the
    placement history by cluster index (shoal/ps/ring.py; ps k -> ps (k + 1) % n while nothing
    was re-homed or joined): when the history this ps learns (`place`, `adopt`) changes it, the
    ps sends to its new successor and takes replicas from its new predecessor. Every ps of the
    job should get the same options.
    """

    def __init__(self, cluster: ClusterSpec | Mapping[str, Any], job_name: str = "ps", task_index: int = 0,
                 *, secret: JobSecret, security: Security = Security.AUTO,
                 replication: ReplicationOptions = ReplicationOptions()):
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.from_dict(dict(cluster))
        self.config = ClusterConfig(spec, TaskId(job_name, task_index))
        if job_name != "ps":
            raise PsError(f"shoal.Server runs ps tasks, not {job_name!r}; workers train with shoal.TrainingSession")
        self._secret = secret
        self._security = security
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._rpc: RpcServer | None = None
        self.reason: str | None = None
        self._failed: str | None = None  # why the serving thread failed, if it did
        self._last_request_at: Optional[float] = None  # written by the serving thread
        self._unfinished = 1
        self._chief_finished = False
        self._drain = threading.Event()  # set by join() on SIGTERM; the serving thread drains the service
        self._chief = str(self.config.chief_task)
        self._noted_version: int | None = None  # the membership version _note_replicas last read
        num_ps = len(self.config.ps_addresses)
        self.service = PsService(str(self.config.task), max(1, self.config.num_replicas), self._job_over,
                                 replica_names=[str(t) for t in self.config.replica_tasks],
                                 ps_index=task_index, num_ps=num_ps)
        self.replication = replication
        self._in_ring = True  # whether the ring (shoal/ps/ring.py) has this ps, as of the history last followed
        # how many ps the job started with (the ring's start): ps 0 says so when this ps was added to the job
        self._start_ps = num_ps
        self._ring_key: tuple[int, int] | None = None  # (start ps, history length) the ring was last followed at
        self.joiner: Joiner | None = None
        if task_index > 0:  # registers with ps 0, so a chief finds a ps added to the running job
            self.joiner = Joiner(task_index, self.address, self.config.ps_addresses[0], secret,
                                 on_joined=self._registered, security=security)
        self.replicator: Replicator | None = None
        if replication.enabled and num_ps > 1:
            successor = (task_index + 1) % num_ps
            self.replicator = Replicator(task_index, successor, self.config.ps_addresses[successor], secret,
                                         replication, security=security)

    @classmethod
    def for_task(cls, config: ClusterConfig, *, secret: JobSecret, security: Security = Security.AUTO,
                 replication: ReplicationOptions = ReplicationOptions()) -> "Server":
        return cls(config.cluster, config.task.job, config.task.index, secret=secret, security=security,
                   replication=replication)

    @property
    def address(self) -> str:
        return self.config.cluster.task_address("ps", self.config.task.index)

    def start(self) -> "Server":
        """Bind and begin serving in the background. Returns self. Does not block."""
        if self._thread is not None:
            return self
        show_shoal_logs()
        keep_freed_memory()
        share_main_arena()  # before the serving and zmq threads exist: big shards' buffers are then reused
        self._rpc = RpcServer(self.address, self._secret, self._handle, str(self.config.task),
                              into=self.service.tensor_destination, security=self._security,
                              borrows=self.service.reads_tensors_in_place)
        self._rpc.start()
        log.info("%s serving at %s (%s; job secret from %s)", self.config.task, self.address, self._rpc.security.name,
                 self._secret.source)
        if self.replication.enabled and self.replicator is None:
            log.warning("%s: replication asked for, but the job has one ps and no peer to hold a replica; a "
                        "restarted ps is rebuilt from the newest checkpoint", self.config.task)
        if self.replicator is not None:
            self.replicator.start()
        if self.joiner is not None:
            self.joiner.start()
        self._thread = threading.Thread(target=self._serve, name=f"shoal-{self.config.task}", daemon=True)
        self._thread.start()
        return self

    def _handle(self, request: Request) -> None:
        """Run one request through the service and send the replies it gives (serving thread)."""
        if request.op != _HEARTBEAT:  # a hung replica's heartbeat thread must not keep a draining ps up
            self._last_request_at = time.monotonic()
        try:
            replies = self.service.handle(request)
        finally:
            self._note_replicas()
        self._send(replies)

    def _note_replicas(self) -> None:
        """What join() needs to know on SIGTERM, read from the serving thread's service (again
        only once the membership changed: every change bumps its version)."""
        version = self.service.membership.version
        if version == self._noted_version:
            return
        self._noted_version = version
        self._unfinished = self.service.unfinished_replicas
        self._chief_finished = self.service.has_finished(self._chief)

    def _send(self, replies) -> None:
        for reply in replies:
            tracker = self._rpc.reply(reply.request, reply.body.fields(), reply.tensors, track=bool(reply.shards))
            self.service.store.track(reply.shards, tracker)

    def _send_released(self, replies) -> None:
        """Send the replies a chore released (requests that waited: a sync step, a pull); one
        that cannot be sent gets an error reply instead, and the ps serves on (serving thread)."""
        for reply in replies:
            try:
                self._send([reply])
            except Exception as e:  # a bug: never the end of the ps
                why = bounded(repr(e))
                log.error("%s could not send a reply to %r: %s", self.config.task, reply.request.op, why)
                try:
                    self._rpc.reply_error(reply.request, f"internal error in {self.config.task} replying: {why}")
                except Exception:  # noqa: BLE001 — nothing more to try: its client's wait times out
                    log.debug("%s: the error reply could not be sent either", self.config.task, exc_info=True)

    def _serve(self) -> None:
        drained = False
        next_chores = 0.0
        try:
            while not self._stopped.is_set():
                if self._rpc.serve_once(100) and time.monotonic() < next_chores:
                    continue  # a burst of requests: the chores below wait up to CHORES_EVERY_S
                self._send_released(self.service.tick())
                self._note_replicas()
                self.service.log_sync_wait()
                self._follow_ring()
                self._replicate_if_due()
                if self._drain.is_set() and not drained:
                    drained = True
                    self._send_released(self.service.drain())
                next_chores = time.monotonic() + CHORES_EVERY_S
        except Exception as e:
            self._failed = bounded(repr(e))
            log.critical("%s: its serving thread failed, so this ps stops: %s", self.config.task, self._failed,
                         exc_info=len(repr(e)) <= ERROR_TEXT_MAX)
        finally:
            if self.joiner is not None:
                self.joiner.close()
            if self.replicator is not None:
                self.replicator.close()
            self._rpc.close()

    def _registered(self, reply: JoinReply) -> None:
        """ps 0 took this ps's `join` (the joiner's thread). A ps beyond ps 0's cluster was added
        to the running job: the ring starts from ps 0's cluster, and has this ps once the placement
        history says it joined (the serving thread follows it: `_follow_ring`). A ps that was
        re-homed while it was down is not restored by anyone: this process stops, and says why."""
        if reply.retired:
            log.warning("%s was re-homed while it was down: its shards moved to the other ps tasks and the job trains "
                        "without it, so this process stops (to add a ps to a running job: shoal scale JOB ps=N, "
                        "docs/elastic.md)", self.config.task)
            self._job_over("re-homed before this process started")
            return
        if self.config.task.index >= reply.num_ps:
            self._start_ps = reply.num_ps  # one int, read by the serving thread
            if self.replication.enabled:
                log.info("%s was added to the running job (ps 0's cluster has %d ps): it replicates once the "
                         "placement history says it joined", self.config.task, reply.num_ps)

    def _follow_ring(self) -> None:
        """Serving thread: when the placement history (or the ring's start) changed, take
        replicas from the new predecessor and send them to the new successor (shoal/ps/ring.py).
        A send in flight to the former successor is abandoned: blocks up to about
        replicator.CLOSE_CHECK_EVERY_S for that."""
        key = (self._start_ps, len(self.service.history))  # the history only grows (a prefix is checked)
        if key == self._ring_key:
            return
        self._ring_key = key
        history = list(self.service.history)
        start, me = range(key[0]), self.config.task.index
        self._in_ring = me in ring_members(start, history)
        self.service.replicas.follow(ring_predecessor(start, history, me))
        successor = ring_successor(start, history, me)
        if not self.replication.enabled or (self.replicator is not None and self.replicator.successor == successor):
            return
        if self.replicator is not None:
            self.replicator.close()
            self.replicator = None
        if successor is None:
            if self._in_ring:
                log.info("%s is the only ps left in the replica ring: it sends no replicas", self.config.task)
            return
        address = joined_address(history, successor)
        if address is None and successor < len(self.config.ps_addresses):
            address = self.config.ps_addresses[successor]
        if address is None:
            log.warning("%s: its successor in the replica ring, ps:%d, is neither in its cluster nor joined in the "
                        "placement history; it sends no replicas", self.config.task, successor)
            return
        self.replicator = Replicator(me, successor, address, self._secret, self.replication,
                                     security=self._security).start()

    def _replicate_if_due(self) -> None:
        """Hand the replicator a copy of the shards when one is due (serving thread: the copy is
        consistent because no request runs meanwhile). Not from a ps that is not in the ring
        (added to the running job, until the placement history says it joined)."""
        if self.replicator is None or not self._in_ring or not self.replicator.due(self.service.step):
            return
        started = time.perf_counter()
        replica = self.service.own_replica()
        if replica is not None:
            self.replicator.offer(*replica, copy_ms=(time.perf_counter() - started) * 1000)

    def _job_over(self, reason: str) -> None:
        if not self._stopped.is_set():
            self.reason = reason
            log.info("%s stopping: %s", self.config.task, reason)
            if self._rpc is not None and self._rpc.shared_requests:
                log.info("%s: %d requests came through shared memory, %d on the doorbell (their headers on"
                         " a local socket, not zmq: docs/wire-protocol.md)", self.config.task,
                         self._rpc.shared_requests, self._rpc.bell_requests)
            closures = self.service.closures
            if closures.applied or closures.duplicates:
                log.info("%s applied %d closure pushes and dropped %d duplicates of re-run closures",
                         self.config.task, closures.applied, closures.duplicates)
            self._stopped.set()

    def join(self, timeout: float | None = None) -> bool:
        """Start if needed, then block until the job is over (or `timeout` seconds passed).
        Returns True when the server has stopped. Ctrl-C stops the server and re-raises; after
        SIGTERM it raises ServerTerminated once the replicas are through (see the class); ServerFailed
        if the serving thread failed."""
        self.start()
        sigterm.acquire()
        drain: TermDrain | None = None
        try:
            while self._thread.is_alive():
                self._thread.join(0.2 if timeout is None else min(0.2, timeout))
                if sigterm.requested():
                    drain = drain or self._start_drain()
                    why = drain.stop_reason(time.monotonic(), unfinished_replicas=self._unfinished,
                                            chief_finished=self._chief_finished,
                                            last_request_at=self._last_request_at)
                    if why is not None:
                        self._job_over(why)
                        self._thread.join(5)
                if timeout is not None:
                    timeout -= 0.2
                    if timeout <= 0:
                        break
        except KeyboardInterrupt:
            self.stop()
            raise
        finally:
            sigterm.release()
        if self._failed is not None:
            raise ServerFailed(str(self.config.task), self._failed)
        if sigterm.requested() and not self._thread.is_alive() and not self.service.all_done:
            raise ServerTerminated(str(self.config.task), self.reason or "SIGTERM")
        return not self._thread.is_alive()

    def _start_drain(self) -> TermDrain:
        self._drain.set()
        log.info("%s got SIGTERM: serving on until the training replicas have finished (%d left)",
                 self.config.task, self._unfinished)
        return TermDrain(sigterm.requested_at() or time.monotonic())

    def stop(self) -> None:
        """Stop serving and release the port. Idempotent; blocks until the serving thread ended."""
        self._job_over(self.reason or "stopped")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
