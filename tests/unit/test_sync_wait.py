"""A sync step names the replicas it waits for: in words (SyncWait), in the ps's status reply
and in the ps's log, at most every so often (SyncWaitWatch). No sockets: the service is fed
requests directly, with an injected clock."""

import itertools
import logging

import numpy as np

from shoal.ps.optimizers import SGD
from shoal.ps.protocol import (ASYNC, HeartbeatRequest, InitRequest, Mode, Phase, PushRequest, ReadyRequest,
                               StatusReply, StatusRequest, TrainingMode)
from shoal.ps.service import PsService
from shoal.ps.sync_wait import SyncWait, SyncWaitWatch, sync_wait
from shoal.wire import Message, Request

_rids = itertools.count(1)
REPLICAS = ("chief:0", "worker:0", "worker:1")


def request(message, tensors=None):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(b"peer", Message(header, dict(tensors or {})))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def sync_service(replicas=3, clock=None):
    service = PsService("ps:0", 3, lambda reason: None, replica_names=REPLICAS, clock=clock or Clock())
    service.handle(request(InitRequest(SGD(1.0).to_config(), TrainingMode(Mode.SYNC, replicas)),
                           {"w": np.zeros(2, np.float32)}))
    service.handle(request(ReadyRequest()))
    return service


def push(service, task, step=0):
    return service.handle(request(PushRequest(task, step), {"w": np.ones(2, np.float32)}))


def status(service) -> StatusReply:
    (reply,) = service.handle(request(StatusRequest()))
    return StatusReply.decode(reply.body.fields())  # as a worker reads it off the wire


def test_status_names_the_replicas_a_sync_step_waits_for():
    service = sync_service()
    push(service, "chief:0")
    wait = status(service).sync_wait
    assert wait == SyncWait(0, ("chief:0",), 2, ("worker:0", "worker:1"))
    assert wait.describe() == "step 0 waits for 2 more gradients, from worker:0, worker:1 (has chief:0's)"


def test_status_of_an_async_ps_has_no_sync_wait():
    service = PsService("ps:0", 2, lambda reason: None, replica_names=REPLICAS[:2])
    service.handle(request(InitRequest(SGD(1.0).to_config(), ASYNC), {"w": np.zeros(2, np.float32)}))
    assert status(service).sync_wait is None


def test_status_from_a_ps_without_the_sync_fields_reads_as_empty():
    fields = StatusReply(Phase.READY, TrainingMode(Mode.SYNC, 2), 3, 1, 8, 1, (), "ab").fields()
    for key in ("sync_have", "sync_needed", "sync_missing"):
        del fields[key]
    assert StatusReply.decode(fields).sync_wait == SyncWait(3, (), 0, ())


def test_describe_with_backup_workers_says_any_of_and_marks_finished_replicas():
    wait = sync_wait(4, ["worker:0"], 1, REPLICAS, done=["worker:1"])
    assert wait.describe() == ("step 4 waits for 1 more gradient, from any of chief:0, worker:1 (done) "
                               "(has worker:0's)")


def test_ps_logs_a_step_that_waited_too_long_naming_the_missing_replica(caplog):
    clock = Clock()
    service = sync_service(replicas=2, clock=clock)
    caplog.set_level(logging.INFO, logger="shoal")
    push(service, "chief:0")
    clock.now += 5
    service.log_sync_wait()
    assert not caplog.records  # a step may take a while: not yet
    clock.now += 6
    service.log_sync_wait()
    service.log_sync_wait()  # rate-limited: once per interval
    assert [r.getMessage() for r in caplog.records] == [
        "ps:0: step 0 waits for 1 more gradient, from any of worker:0, worker:1 (has chief:0's), for 11s; "
        "is worker:0 / worker:1 running?"]
    push(service, "worker:1")  # the step completes
    clock.now += 60
    service.log_sync_wait()
    assert len(caplog.records) == 1


def test_a_step_that_a_departure_completed_is_not_logged_as_the_next_step_waiting(caplog):
    """worker:1 freezes while step 0 waits for it; its heartbeat timeout (4 s) drops it and step 0
    completes. The next step has waited for nothing: the ps used to log it 10 s after step 0's
    first gradient, as waiting for the workers that were healthy all along."""
    clock = Clock()
    service = sync_service(replicas=3, clock=clock)  # every replica's gradient, no backup
    for task in REPLICAS:
        service.handle(request(HeartbeatRequest(task, "a", 4_000)))
    caplog.set_level(logging.INFO, logger="shoal")
    push(service, "chief:0")
    push(service, "worker:0")
    for _ in range(12):  # worker:1 sends nothing from now on
        clock.now += 1
        for task in ("chief:0", "worker:0"):
            service.handle(request(HeartbeatRequest(task, "a", 4_000)))
        service.tick()
        service.log_sync_wait()
    assert status(service).step == 1, "worker:1's departure should have completed step 0"
    assert not [r.getMessage() for r in caplog.records if "waits for" in r.getMessage()]
    push(service, "chief:0", step=1)  # step 1 waits from now on, and is logged once it waited 10 s
    clock.now += 11
    service.log_sync_wait()
    assert [r.getMessage() for r in caplog.records if "waits for" in r.getMessage()] == [
        "ps:0: step 1 waits for 1 more gradient, from worker:0 (has chief:0's), for 11s; is worker:0 running?"]


def test_watch_says_again_every_interval_while_the_step_waits():
    watch = SyncWaitWatch(after_s=10)
    assert watch.due(0) is None
    watch.gradient_arrived(3, now=0)
    watch.gradient_arrived(3, now=4)  # same step: the wait started at 0
    assert [watch.due(t) for t in (9, 10, 15, 20)] == [None, 10, None, 20]
