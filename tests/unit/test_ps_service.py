"""The ps service without a socket: requests in, the replies it returns out."""

import itertools

import numpy as np
import pytest

from shoal.ps.errors import PsError
from shoal.ps.optimizers import SGD, Adagrad
from shoal.ps.protocol import (ASYNC, ClosureTag, DoneRequest, FailedRequest, Hyper, InitRequest, Mode, Phase, PullReply,
                               PullRequest, PushOutcome, PushReply, PushRequest, ReadyRequest, StatusReply,
                               StatusRequest, TrainingMode)
from shoal.ps.service import PsService
from shoal.wire import Message, Request

_rids = itertools.count(1)


def request(message, tensors=None, peer=b"peer"):
    header = dict(message.fields(), op=message.op.value, rid=next(_rids), v=2, t=[])
    return Request(peer, Message(header, dict(tensors or {})))


def make_service(num_replicas=2, training=ASYNC, rule=SGD(1.0)):
    ended = []
    service = PsService("ps:0", num_replicas, ended.append)
    w = np.zeros(3, np.float32)
    service.handle(request(InitRequest(rule.to_config(), training), {"w": w}))
    service.handle(request(ReadyRequest()))
    return service, ended


def push(service, task, step, value=1.0, hyper=None, closure=None):
    return service.handle(request(PushRequest(task, step, hyper=hyper, closure=closure),
                                  {"w": np.full(3, value, np.float32)}))


def test_status_reports_phase_and_mode_as_enums():
    service = PsService("ps:0", 1, lambda reason: None)
    (reply,) = service.handle(request(StatusRequest()))
    assert reply.body.phase is Phase.EMPTY and reply.body.training is None
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    status = StatusReply.decode(service.handle(request(StatusRequest()))[0].body.fields())
    assert status.ready and status.training == TrainingMode(Mode.SYNC, 2)


def test_async_pull_waiting_for_a_step_is_answered_when_a_push_reaches_it():
    service, _ = make_service()
    pull = request(PullRequest(("w",), min_step=2))
    assert service.handle(pull) == []  # deferred: the ps is at step 0
    assert len(push(service, "worker:0", 0)) == 1  # step 1: still not there
    replies = push(service, "worker:1", 1)
    assert [r.request for r in replies][1:] == [pull]
    assert replies[1].body == PullReply(2)
    np.testing.assert_array_equal(replies[1].tensors["w"], np.full(3, -2.0))


def test_sync_push_is_deferred_until_every_replica_pushed_then_both_are_answered():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    assert push(service, "worker:0", 0, 1.0) == []
    replies = push(service, "worker:1", 0, 3.0)
    assert {r.request.header["task"] for r in replies} == {"worker:0", "worker:1"}
    assert all(r.body == PushReply(1, PushOutcome.APPLIED) for r in replies)
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -2.0))  # the average was applied
    (stale,) = push(service, "worker:0", 0)
    assert stale.body.outcome is PushOutcome.STALE


def test_init_with_another_mode_is_refused_naming_both():
    service, _ = make_service()
    with pytest.raises(PsError, match=r"already runs async training, a worker asked for sync \(2 replicas"):
        service.handle(request(InitRequest(SGD(1.0).to_config(), TrainingMode(Mode.SYNC, 2)),
                               {"w": np.zeros(3, np.float32)}))


def test_push_before_ready_is_refused():
    service = PsService("ps:0", 1, lambda reason: None)
    with pytest.raises(PsError, match="not initialized yet"):
        push(service, "worker:0", 0)


def test_job_is_over_when_every_replica_is_done():
    service, ended = make_service()
    service.handle(request(DoneRequest("worker:0")))
    assert ended == []
    service.handle(request(DoneRequest("worker:1")))
    assert ended == ["all 2 workers finished"]


def test_a_failed_replica_keeps_the_job_going_while_another_finished():
    service, ended = make_service()
    service.handle(request(FailedRequest("worker:0")))  # e.g. Ctrl-C in the chief, which will be restarted
    service.handle(request(DoneRequest("worker:1")))
    assert ended == []
    service.handle(request(DoneRequest("worker:0")))  # the restarted chief finished
    assert ended == ["all 2 workers finished"]


def test_job_is_over_when_every_replica_failed():
    service, ended = make_service()
    service.handle(request(FailedRequest("worker:0")))
    service.handle(request(FailedRequest("worker:1")))
    assert ended == ["all 2 workers failed"]


def test_async_push_applies_its_own_learning_rate_and_weight_decay():
    service, _ = make_service()
    (first,) = push(service, "worker:0", 0, 1.0, hyper={"w": Hyper(0.5)})
    np.testing.assert_array_equal(first.tensors["w"], np.full(3, -0.5))  # lr 0.5, not the rule's 1.0
    (second,) = push(service, "worker:0", 1, 1.0, hyper={"w": Hyper(0.1, weight_decay=2.0)})
    np.testing.assert_allclose(second.tensors["w"], -0.5 - 0.1 * (1.0 + 2.0 * -0.5))


def test_sync_step_applies_the_learning_rate_of_the_push_that_completes_it():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    assert push(service, "worker:0", 0, 1.0, hyper={"w": Hyper(0.25)}) == []
    replies = push(service, "worker:1", 0, 3.0, hyper={"w": Hyper(0.25)})
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -0.5))  # 0.25 x the average, 2


@pytest.mark.parametrize("rule, hyper, match", [
    (SGD(1.0), {"v": Hyper(0.1)}, r"names a learning rate for \['v'\] but pushes \['w'\]"),
    (Adagrad(1.0), {"w": Hyper(0.1, 0.5)}, "adagrad has no weight decay"),
])
def test_push_with_hyper_the_rule_cannot_take_is_refused_before_it_counts(rule, hyper, match):
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 1), rule=rule)
    with pytest.raises(PsError, match=match):
        push(service, "worker:0", 0, hyper=hyper)
    assert service.step == 0


def make_two_shard_service(training):
    service = PsService("ps:0", 2, lambda reason: None)
    service.handle(request(InitRequest(SGD(1.0).to_config(), training),
                           {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}))
    service.handle(request(ReadyRequest()))
    return service


def push_part(service, task, step, name, value, ends_step):
    return service.handle(request(PushRequest(task, step, ends_step=ends_step), {name: np.full(2, value, np.float32)}))


def test_sync_push_in_parts_answers_each_part_when_its_shards_are_updated():
    service = make_two_shard_service(TrainingMode(Mode.SYNC, 2))
    assert push_part(service, "worker:0", 0, "a", 1.0, False) == []
    assert push_part(service, "worker:0", 0, "b", 1.0, True) == []
    replies = push_part(service, "worker:1", 0, "a", 3.0, False)  # shard a complete: both a-parts answered
    assert [r.request.header["task"] for r in replies] == ["worker:0", "worker:1"]
    assert all(r.body == PushReply(1, PushOutcome.APPLIED) and set(r.tensors) == {"a"} for r in replies)
    np.testing.assert_array_equal(replies[0].tensors["a"], np.full(2, -2.0))
    assert service.step == 0  # shard b still waits for worker:1
    pull = request(PullRequest(("a", "b"), min_step=1))
    assert service.handle(pull) == []
    replies = push_part(service, "worker:1", 0, "b", 5.0, True)
    assert pull in [r.request for r in replies] and len(replies) == 3 and service.step == 1
    np.testing.assert_array_equal(replies[0].tensors["b"], np.full(2, -3.0))


def test_sync_part_of_a_shard_already_applied_is_stale_and_waits_for_the_next_step():
    service = make_two_shard_service(TrainingMode(Mode.SYNC, 1))  # one of two replicas: a backup worker
    assert len(push_part(service, "worker:0", 0, "a", 1.0, False)) == 1
    assert push_part(service, "worker:1", 0, "a", 9.0, False) == []  # stale, answered when step 1 begins
    replies = push_part(service, "worker:0", 0, "b", 1.0, True)
    stale = [r for r in replies if r.request.header["task"] == "worker:1"]
    assert stale[0].body == PushReply(1, PushOutcome.STALE)
    np.testing.assert_array_equal(stale[0].tensors["a"], np.full(2, -1.0))  # worker:1's 9.0 was not applied


def test_async_push_in_parts_counts_one_step_per_push():
    service = make_two_shard_service(ASYNC)
    (first,) = push_part(service, "worker:0", 0, "a", 1.0, False)
    (last,) = push_part(service, "worker:0", 0, "b", 1.0, True)
    assert (first.body.step, last.body.step, service.step) == (0, 1, 1)


def test_a_closure_push_applied_once_is_answered_duplicate_when_a_re_run_sends_it_again_async():
    service, _ = make_service()
    (first,) = push(service, "worker:1", 0, 1.0, closure=ClosureTag("c.7", 0))
    assert first.body == PushReply(1, PushOutcome.APPLIED)
    (again,) = push(service, "worker:0", 1, 1.0, closure=ClosureTag("c.7", 0))  # re-run elsewhere
    assert again.body == PushReply(1, PushOutcome.DUPLICATE)  # not counted as a step
    np.testing.assert_array_equal(again.tensors["w"], np.full(3, -1.0))  # the current values, applied once
    (second,) = push(service, "worker:0", 1, 1.0, closure=ClosureTag("c.7", 1))  # its next push is new
    assert second.body == PushReply(2, PushOutcome.APPLIED)
    assert (service.closures.applied, service.closures.duplicates) == (2, 1)


def test_untagged_pushes_are_all_applied_as_before():
    service, _ = make_service()
    for step in range(3):
        push(service, "worker:0", step)
    assert service.step == 3 and len(service.closures) == 0


def test_a_closure_push_accumulated_in_a_sync_step_is_not_counted_twice():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    assert push(service, "worker:0", 0, 1.0, closure=ClosureTag("c.1", 0)) == []  # waits for worker:1
    dup = request(PushRequest("worker:1", 0, closure=ClosureTag("c.1", 0)), {"w": np.full(3, 5.0, np.float32)})
    assert service.handle(dup) == []  # the re-run on worker:1: answered when the step completes, as the original
    replies = push(service, "worker:1", 0, 3.0, closure=ClosureTag("c.2", 0))
    applied = [r for r in replies if r.request is not dup]
    assert all(r.body == PushReply(1, PushOutcome.APPLIED) for r in applied) and len(applied) == 2
    np.testing.assert_array_equal(applied[0].tensors["w"], np.full(3, -2.0))  # mean of 1 and 3, not of 5
    (dup_reply,) = [r for r in replies if r.request is dup]
    assert dup_reply.body == PushReply(1, PushOutcome.DUPLICATE)
    np.testing.assert_array_equal(dup_reply.tensors["w"], np.full(3, -2.0))


def test_a_closure_re_run_by_its_restarted_worker_in_the_same_sync_step_has_its_next_push_counted():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    assert push(service, "worker:0", 0, 1.0, closure=ClosureTag("c.1", 0)) == []  # then worker:0 dies
    # restarted, worker:0 runs closure c.1 again from its first push, still in step 0
    assert push(service, "worker:0", 0, 1.0, closure=ClosureTag("c.1", 0)) == []  # waits for step 0, as the original
    replies = push(service, "worker:1", 0, 3.0, closure=ClosureTag("c.2", 0))
    assert sorted(r.body.outcome.value for r in replies) == ["applied", "applied", "duplicate"]
    assert service.step == 1 and all(r.body.step == 1 for r in replies)
    # so the re-run's next push belongs to step 1 and counts; answered at once, it would have been
    # sent for step 0, which worker:0 already pushed: dropped as a duplicate of this step
    assert push(service, "worker:0", 1, 1.0, closure=ClosureTag("c.1", 1)) == []
    (done, *_) = push(service, "worker:1", 1, 1.0, closure=ClosureTag("c.2", 1))
    assert done.body == PushReply(2, PushOutcome.APPLIED)
    assert (service.closures.applied, service.closures.duplicates) == (4, 1)


def test_a_closure_push_repeated_after_its_sync_step_completed_is_answered_at_once():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 2))
    push(service, "worker:0", 0, 1.0, closure=ClosureTag("c.1", 0))
    push(service, "worker:1", 0, 3.0, closure=ClosureTag("c.2", 0))
    # worker:0, restarted, re-runs c.1 from step 1: its first push was applied in step 0, which is done
    (dup,) = push(service, "worker:0", 1, 1.0, closure=ClosureTag("c.1", 0))
    assert dup.body == PushReply(1, PushOutcome.DUPLICATE)


def test_a_stale_closure_push_is_not_remembered_so_its_re_run_is_applied():
    service, _ = make_service(training=TrainingMode(Mode.SYNC, 1))
    push(service, "worker:0", 0)
    (stale,) = push(service, "worker:1", 0, closure=ClosureTag("c.3", 0))
    assert stale.body.outcome is PushOutcome.STALE
    (rerun,) = push(service, "worker:1", 1, closure=ClosureTag("c.3", 0))
    assert rerun.body.outcome is PushOutcome.APPLIED


def test_the_closure_ledger_forgets_the_oldest_tags_beyond_its_window():
    ended = []
    service = PsService("ps:0", 2, ended.append, closure_window=2)
    service.handle(request(InitRequest(SGD(1.0).to_config(), ASYNC), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    for n in range(3):
        push(service, "worker:0", n, closure=ClosureTag(f"c.{n}", 0))
    assert len(service.closures) == 2
    (forgotten,) = push(service, "worker:0", 3, closure=ClosureTag("c.0", 0))
    assert forgotten.body.outcome is PushOutcome.APPLIED  # beyond the window: applied again, as documented
    (remembered,) = push(service, "worker:0", 4, closure=ClosureTag("c.2", 0))
    assert remembered.body.outcome is PushOutcome.DUPLICATE


@pytest.mark.parametrize("training", [ASYNC, TrainingMode(Mode.SYNC, 2), TrainingMode(Mode.SYNC, 3)],
                         ids=["async", "sync-2", "sync-3"])
def test_a_push_is_consumed_before_the_handler_returns_so_its_tensors_may_stay_in_the_clients_memory(training):
    """PsService.reads_tensors_in_place says a push's gradients may be read where they arrived
    (a client's shared memory, which it rewrites for its next request once answered): nothing may
    read them after `handle` returned, also while the push's reply waits for its sync step."""
    assert PsService.reads_tensors_in_place({"op": "push"}) and not PsService.reads_tensors_in_place({"op": "init"})
    replicas = training.replicas or 2
    service, _ = make_service(num_replicas=replicas, training=training)
    for k in range(replicas):
        grad = np.full(3, float(k + 1), np.float32)
        service.handle(request(PushRequest(f"worker:{k}", 0), {"w": grad}))
        grad[:] = 1000.0  # the client's block, reused once the handler returned
    (reply,) = service.handle(request(PullRequest(("w",), min_step=0)))
    mean = np.mean(np.arange(1, replicas + 1)) if training.replicas else None
    want = -mean if mean is not None else -float(sum(range(1, replicas + 1)))  # SGD(1.0) from zeros
    np.testing.assert_allclose(reply.tensors["w"], np.full(3, want, np.float32))
