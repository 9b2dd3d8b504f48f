"""Membership on the ps: joins, departures, heartbeat expiry, the job's end, and the sync
quorum that follows them (shoal/ps/membership.py, shoal/ps/service.py)."""

import numpy as np
import pytest

from shoal.ps.membership import Membership, MemberState, quorum
from shoal.ps.protocol import (DoneRequest, FailedRequest, HeartbeatRequest, InitRequest, Mode, PushOutcome,
                               ReadyRequest, StatusReply, StatusRequest, TrainingMode)
from shoal.ps.optimizers import SGD
from shoal.ps.service import PsService
from tests.unit.test_ps_service import push, request

EXPECTED = ("chief:0", "worker:0", "worker:1")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_expected_replicas_are_live_until_they_miss_the_join_grace():
    m = Membership(EXPECTED, "chief:0", now=0.0, join_grace_s=60)
    assert m.training == EXPECTED and m.version == 1
    assert m.expire(59.0) == []
    m.heartbeat("chief:0", "a", 10, now=59.0)
    changes = m.expire(61.0)
    assert [c.describe() for c in changes] == [
        "worker:0 left (not heard from within 60s of the start; 0 gradients applied)",
        "worker:1 left (not heard from within 60s of the start; 0 gradients applied)"]
    assert m.training == ("chief:0",) and m.version == 4


def test_a_member_that_misses_its_heartbeat_is_dropped_and_rejoins_once_it_echoes_its_challenge():
    m = Membership(EXPECTED, "chief:0", now=0.0, new_challenge=iter(["c1", "c2"]).__next__)
    for task in EXPECTED:
        m.heartbeat(task, "a", 5, now=1.0)
    m.heartbeat("worker:1", "a", 5, now=4.0)
    assert m.expire(6.0) == []  # due at 6.0: not late yet
    changes = m.expire(6.5)
    assert [c.describe() for c in changes] == ["chief:0 left (no heartbeat for 5s; 0 gradients applied)",
                                               "worker:0 left (no heartbeat for 5s; 0 gradients applied)"]
    assert m.training == ("worker:1",)
    assert m.heartbeat("worker:0", "a", 5, now=7.0) is None  # it may have been sent long ago
    assert m.challenge("worker:0", "a", now=7.0) == "c1" and m.challenge("chief:0", "a", now=7.0) == "c2"
    assert m.challenge("worker:0", "a", now=7.1) == "c1"  # the same while it is fresh
    assert m.challenge("worker:0", "b", now=7.0) == "" and m.challenge("worker:1", "a", now=7.0) == ""
    assert m.heartbeat("worker:0", "a", 5, now=7.2, answer="c2") is None  # chief:0's challenge, not its own
    assert m.heartbeat("worker:0", "a", 5, now=7.2, answer="c1").describe() == "worker:0 rejoined"
    assert m.training == ("worker:0", "worker:1") and m.challenge("worker:0", "a", now=7.3) == ""


def test_an_answer_older_than_its_window_does_not_rejoin_and_a_new_challenge_is_made():
    """worker:1 answered, and its link was cut before the answer went out: held back with the
    process's other heartbeats, it comes when the link is up again, long after. By then the
    process may be gone, so the answer no longer counts; a live one answers the new challenge."""
    m = Membership(EXPECTED, "chief:0", now=0.0, new_challenge=iter(["c1", "c2"]).__next__)
    m.heartbeat("worker:1", "a", 4, now=1.0)  # interval 1 s: answerable for 2 s
    m.expire(5.5)
    assert m.heartbeat("worker:1", "a", 4, now=6.0) is None and m.challenge("worker:1", "a", now=6.0) == "c1"
    assert m.heartbeat("worker:1", "a", 4, now=30.0, answer="c1") is None  # held back for 24 s
    assert m.challenge("worker:1", "a", now=30.0) == "c2"
    assert m.heartbeat("worker:1", "a", 4, now=30.01, answer="c1") is None  # the rest of that burst
    assert m.heartbeat("worker:1", "a", 4, now=30.02, answer="c2").describe() == "worker:1 rejoined"


def test_heartbeats_a_cut_link_held_back_from_a_dropped_process_do_not_make_it_a_member_again():
    """The link of worker:1's host went down; the ps dropped it, the launcher restarted it
    elsewhere as worker:2 and its agent killed the process. When the link came up, the
    heartbeats the dead process had queued arrived together, and the last of them used to make
    it a member again: the job then waited for a replica that no longer existed. Then they came
    in two bursts 1.8 s apart (CI), which a rule of "two heartbeats half an interval apart"
    took for a live process: none of them carries the challenge, so none counts."""
    m = Membership(EXPECTED, "chief:0", now=0.0)
    for task in EXPECTED:
        m.heartbeat(task, "a", 4, now=1.0)
    m.heartbeat("chief:0", "a", 4, now=5.0)
    m.heartbeat("worker:0", "a", 4, now=5.0)
    assert [c.task for c in m.expire(5.5)] == ["worker:1"]
    m.heartbeat("worker:2", "c", 4, now=6.0)  # its replacement
    for burst in (30.0, 31.8, 33.0, 90.0, 90.6):  # at any spacing
        for i in range(6):
            assert m.heartbeat("worker:1", "a", 4, now=burst + i * 0.002) is None
    assert m.training == ("chief:0", "worker:0", "worker:2")
    m.finished("worker:0")
    m.finished("worker:2")
    m.finished("chief:0")
    assert m.job_over() == "the chief finished and no replica trains any more (3 done, 1 left)"


def test_a_restarted_process_of_a_dropped_member_rejoins_with_its_first_heartbeat_and_keeps_its_place():
    m = Membership(EXPECTED, "chief:0", now=0.0)
    for task in EXPECTED:
        m.heartbeat(task, "a", 4, now=1.0)
    m.expire(5.5)
    assert m.heartbeat("worker:1", "b", 4, now=6.0).describe() == "worker:1 rejoined"
    # a held-back heartbeat of the dead process "a" does not evict "b" (as the service asks: replaced, then heartbeat)
    assert m.replaced("worker:1", "a") is None and m.heartbeat("worker:1", "a", 4, now=30.0) is None
    assert m.heartbeat("worker:1", "b", 4, now=30.5) is None and m.state("worker:1") is MemberState.TRAINING


def test_the_ps_replies_with_the_challenge_and_a_heartbeat_that_echoes_it_rejoins():
    clock = Clock()
    service = sync_service(clock)
    clock.now += 2.5
    service.tick()
    assert status(service).members == ()
    first = service.handle(request(HeartbeatRequest("worker:1", "a", 2000)))[0].body
    assert not first.joined and len(first.challenge) == 16 and status(service).members == ()
    again = service.handle(request(HeartbeatRequest("worker:1", "a", 2000)))[0].body
    assert not again.joined and again.challenge == first.challenge
    echoed = service.handle(request(HeartbeatRequest("worker:1", "a", 2000, answer=first.challenge)))[0].body
    assert echoed.joined and echoed.challenge == "" and status(service).members == ("worker:1",)
    others = service.handle(request(HeartbeatRequest("chief:0", "a", 2000, answer=first.challenge)))[0].body
    assert not others.joined and others.challenge not in ("", first.challenge)  # each dropped member its own


def test_job_is_over_when_the_chief_is_done_and_no_member_trains():
    m = Membership(EXPECTED, "chief:0", now=0.0)
    for task in EXPECTED:
        m.heartbeat(task, "a", 5, now=0.0)
    m.finished("worker:0")
    assert m.job_over() is None
    m.finished("chief:0")
    assert m.job_over() is None  # worker:1 still trains
    m.expire(10.0)  # ... until it misses its heartbeat
    assert m.state("worker:1") is MemberState.LOST
    assert "the chief finished and no replica trains any more (2 done, 1 left)" == m.job_over()


def test_done_is_final_and_a_failed_process_is_not_taken_back_by_its_late_heartbeat():
    m = Membership(("chief:0", "worker:0"), "chief:0", now=0.0)
    m.heartbeat("worker:0", "p1", 5, now=0.0)
    m.failed("worker:0", "p1")
    assert m.heartbeat("worker:0", "p1", 5, now=1.0) is None  # a heartbeat of the failed process, late
    assert m.state("worker:0") is MemberState.FAILED
    change = m.heartbeat("worker:0", "p2", 5, now=2.0)  # its restarted process
    assert change.describe() == "worker:0 rejoined" and m.state("worker:0") is MemberState.TRAINING
    m.finished("worker:0")
    assert m.heartbeat("worker:0", "p3", 5, now=3.0) is None and m.state("worker:0") is MemberState.DONE


def test_a_worker_outside_the_cluster_joins_with_its_first_heartbeat():
    m = Membership(("chief:0",), "chief:0", now=0.0)
    change = m.heartbeat("worker:7", "a", 5, now=0.0)
    assert change.describe() == "worker:7 joined" and m.training == ("chief:0", "worker:7")
    assert m.describe() == "membership v2: 2 training [chief:0, worker:7]"


def test_heartbeat_timeouts_are_clamped_to_sane_bounds():
    m = Membership((), None, now=0.0)
    m.heartbeat("worker:0", "a", 0.0, now=0.0)
    assert m.expire(0.4) == [] and len(m.expire(0.6)) == 1  # 0 s -> 0.5 s
    m.heartbeat("worker:1", "a", 1e12, now=0.0)
    assert len(m.expire(3601.0)) == 1  # forever -> an hour


@pytest.mark.parametrize("live, backups, want", [(3, 0, 3), (3, 1, 2), (1, 1, 1), (0, 0, 1)])
def test_quorum_is_the_live_members_minus_backups_and_at_least_one(live, backups, want):
    assert quorum([f"worker:{i}" for i in range(live)], backups) == want


# --- the service: a sync step follows the membership ---------------------------------------

def sync_service(clock, replicas=3, names=EXPECTED, on_job_over=lambda reason: None):
    service = PsService("ps:0", len(names), on_job_over, replica_names=names, clock=clock)
    service.handle(request(InitRequest(SGD(1.0).to_config(), TrainingMode(Mode.SYNC, replicas)),
                           {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    for task in names:
        service.handle(request(HeartbeatRequest(task, "a", 2000)))
    return service


def status(service):
    return StatusReply.decode(service.handle(request(StatusRequest()))[0].body.fields())


def test_sync_step_completes_without_a_member_whose_heartbeat_expired_averaging_what_it_has():
    clock = Clock()
    service = sync_service(clock)
    assert push(service, "chief:0", 0, 1.0) == [] and push(service, "worker:0", 0, 3.0) == []
    clock.now += 1.9
    assert service.tick() == []  # worker:1 is still within its 2 s
    for task in ("chief:0", "worker:0"):
        service.handle(request(HeartbeatRequest(task, "a", 2000)))
    clock.now += 0.2
    replies = service.tick()
    assert sorted(r.request.header["task"] for r in replies) == ["chief:0", "worker:0"]
    assert all(r.body.outcome is PushOutcome.APPLIED and r.body.step == 1 for r in replies)
    np.testing.assert_array_equal(replies[0].tensors["w"], np.full(3, -2.0))  # (1 + 3) / 2, not / 3
    assert status(service).members == ("chief:0", "worker:0")


def test_a_heartbeat_from_a_new_process_of_a_member_replaces_the_old_one_at_once():
    m = Membership(EXPECTED, "chief:0", now=0.0)
    m.heartbeat("worker:1", "old", 20, now=1.0)
    assert m.replaced("worker:1", "old") is None and m.replaced("worker:1", "") is None
    change = m.replaced("worker:1", "new")
    assert change.describe() == ("worker:1 left (a new process of it heartbeats: it was restarted; 0 gradients"
                                 " applied)")
    assert m.heartbeat("worker:1", "old", 20, now=2.0) is None  # the old one's late heartbeat: not taken back
    assert m.heartbeat("worker:1", "new", 20, now=2.0).describe() == "worker:1 rejoined"
    # and once the new one trains, a late heartbeat of the old one neither replaces it nor rejoins
    assert m.replaced("worker:1", "old") is None and m.heartbeat("worker:1", "old", 20, now=3.0) is None
    assert m.training == ("chief:0", "worker:0", "worker:1") and m.replaced("worker:1", "new") is None


def test_a_replica_restarted_after_the_chief_finished_trains_on_the_job_is_not_over():
    ended = []
    service = sync_service(Clock(), replicas=2, names=("worker:0", "worker:1"), on_job_over=ended.append)
    service.handle(request(DoneRequest("worker:0")))
    service.handle(request(HeartbeatRequest("worker:1", "its-new-process", 2000)))
    assert ended == [] and not service.all_done and status(service).members == ("worker:1",)


def test_a_sync_step_waiting_for_a_replica_restarted_after_a_sigkill_completes_when_its_new_process_heartbeats():
    """The launcher restarts a SIGKILLed worker within a second, and a SIGKILL sends no 'failed':
    the step waited for the old process's gradient until its heartbeats were overdue (20 s)."""
    clock = Clock()
    service = sync_service(clock)
    assert push(service, "chief:0", 0, 1.0) == [] and push(service, "worker:0", 0, 3.0) == []
    clock.now += 0.5
    replies = service.handle(request(HeartbeatRequest("worker:1", "its-new-process", 2000)))
    pushed = [r for r in replies if r.request.header.get("task") in ("chief:0", "worker:0")]
    assert sorted(r.request.header["task"] for r in pushed) == ["chief:0", "worker:0"]
    assert all(r.body.outcome is PushOutcome.APPLIED and r.body.step == 1 for r in pushed)
    assert status(service).members == ("chief:0", "worker:0", "worker:1")  # the new process trains on


def test_sync_gradient_of_a_member_that_left_mid_step_is_averaged_in():
    clock = Clock()
    service = sync_service(clock)
    push(service, "chief:0", 0, 1.0)
    push(service, "worker:1", 0, 5.0)
    (ack, *released) = service.handle(request(FailedRequest("worker:0")))  # quorum 3 -> 2: step complete
    assert len(released) == 2
    np.testing.assert_array_equal(released[0].tensors["w"], np.full(3, -3.0))


def test_a_member_that_joins_mid_step_counts_from_the_next_step():
    clock = Clock()
    service = sync_service(clock, replicas=2, names=("chief:0", "worker:0"))
    assert push(service, "chief:0", 0) == []
    service.handle(request(HeartbeatRequest("worker:5", "a", 2000)))  # joins while step 0 runs
    assert len(push(service, "worker:0", 0)) == 2  # step 0 still needed only 2
    assert push(service, "chief:0", 1) == [] and push(service, "worker:0", 1) == []  # step 1 needs 3
    assert len(push(service, "worker:5", 1)) == 3


def test_backup_workers_stay_backups_as_the_membership_changes():
    clock = Clock()
    service = sync_service(clock, replicas=2)  # 3 replicas, 1 backup
    assert len(push(service, "chief:0", 0)) == 0 and len(push(service, "worker:0", 0)) == 2
    service.handle(request(DoneRequest("worker:1")))  # 2 live - 1 backup = 1 per step
    assert len(push(service, "chief:0", 1)) == 1


def test_a_departure_names_how_many_of_the_members_gradients_the_ps_applied():
    clock = Clock()
    service = sync_service(clock, replicas=2, names=("chief:0", "worker:0"))
    for step in range(3):
        push(service, "chief:0", step)
        push(service, "worker:0", step)
    push(service, "worker:0", 1)  # stale: not counted
    change = service.membership.finished("worker:0")
    assert change.describe() == "worker:0 finished (3 gradients applied)"


def test_a_replica_stopped_by_sigterm_is_logged_as_stopped_not_failed():
    m = Membership(("worker:0", "worker:1"), "worker:0", now=0.0)
    assert m.failed("worker:1", "p1", terminated=True).describe() == "worker:1 stopped (0 gradients applied)"
    assert m.failed("worker:0", "p1").describe() == "worker:0 failed (0 gradients applied)"


def test_a_job_whose_workers_were_all_stopped_says_stopped_not_failed():
    stopped = Membership(("worker:0", "worker:1"), "worker:0", now=0.0)
    stopped.failed("worker:0", "p1", terminated=True)
    stopped.failed("worker:1", "p2", terminated=True)
    assert stopped.job_over() == "all 2 workers were stopped (SIGTERM)"
    one = Membership(("worker:0",), "worker:0", now=0.0)
    one.failed("worker:0", "p1", terminated=True)
    assert one.job_over() == "the one worker was stopped (SIGTERM)"
    chief = Membership(("chief:0",), "chief:0", now=0.0)
    chief.failed("chief:0", "p1", terminated=True)
    assert chief.job_over() == "the chief was stopped (SIGTERM)"
    mixed = Membership(("worker:0", "worker:1"), "worker:0", now=0.0)
    mixed.failed("worker:0", "p1", terminated=True)
    mixed.failed("worker:1", "p2")
    assert mixed.job_over() == "all 2 workers left: 1 stopped (SIGTERM), 1 failed"


def test_status_reports_the_membership_version_and_members():
    clock = Clock()
    service = sync_service(clock)
    s = status(service)
    assert s.members == EXPECTED and s.membership_version == 4  # v1 + three joins


def test_a_rebuilt_ps_follows_the_other_ps_membership_not_its_cluster():
    """worker:1 left while this ps was down: the rebuilt ps must not wait 120 s for it."""
    clock = Clock()
    service = PsService("ps:1", 3, lambda reason: None, replica_names=EXPECTED, clock=clock)
    service.handle(request(InitRequest(SGD(1.0).to_config(), TrainingMode(Mode.SYNC, 3), step=7,
                                       members=("chief:0", "worker:0")), {"w": np.zeros(3, np.float32)}))
    service.handle(request(ReadyRequest()))
    assert service.membership.training == ("chief:0", "worker:0")
    assert push(service, "chief:0", 7) == []
    assert len(push(service, "worker:0", 7)) == 2  # the step completes with the 2 that train


def test_init_without_members_keeps_expecting_the_cluster():
    service = PsService("ps:0", 3, lambda reason: None, replica_names=EXPECTED, clock=Clock())
    service.handle(request(InitRequest(SGD(1.0).to_config(), TrainingMode(Mode.SYNC, 3)),
                           {"w": np.zeros(3, np.float32)}))
    assert service.membership.training == EXPECTED


@pytest.mark.parametrize("task", ["worker", "worker:x", "w\nps:0 membership v9: 0 training []", ":1", "a b:1"])
def test_a_task_name_that_is_not_job_colon_index_is_refused_naming_it(task):
    from shoal.ps.errors import PsError
    service = PsService("ps:0", 1, lambda reason: None)
    with pytest.raises(PsError, match=r"<job>:<index>"):
        service.handle(request(HeartbeatRequest(task, "a", 2000)))


@pytest.mark.parametrize("value", ["0", "-1", "4000", "soon"])
def test_heartbeat_timeout_flag_out_of_range_is_refused_naming_the_value_and_the_range(value, capsys):
    import argparse
    from shoal.train.flags import add_training_flags
    parser = argparse.ArgumentParser()
    add_training_flags(parser, {})
    with pytest.raises(SystemExit):
        parser.parse_args(["--heartbeat_timeout", value])
    assert f"'{value}' is not a number of seconds from 0.5 to 3600" in capsys.readouterr().err


def test_a_replica_whose_start_failed_leaves_without_ending_the_job_and_may_start_again():
    ended = []
    service = PsService("ps:0", 1, ended.append, clock=Clock())
    service.handle(request(HeartbeatRequest("worker:0", "p1", 2000)))
    service.handle(request(FailedRequest("worker:0", "p1", started=False)))  # e.g. its model dir was locked
    assert ended == [] and service.membership.state("worker:0") is MemberState.LOST
    assert service.handle(request(HeartbeatRequest("worker:0", "p1", 2000)))[0].body.joined is False  # late beat
    assert service.handle(request(HeartbeatRequest("worker:0", "p2", 2000)))[0].body.joined is True  # retried


def test_the_job_end_counts_a_chief_task_apart_from_the_workers():
    with_chief = Membership(("chief:0", "worker:0", "worker:1"), "chief:0", now=0.0)
    for task in ("chief:0", "worker:0", "worker:1"):
        with_chief.finished(task)
    assert with_chief.job_over() == "the chief and all 2 workers finished"
    pair = Membership(("chief:0", "worker:0"), "chief:0", now=0.0)
    pair.failed("chief:0", "p1", terminated=True)
    pair.failed("worker:0", "p2", terminated=True)
    assert pair.job_over() == "the chief and its worker were stopped (SIGTERM)"
    alone = Membership(("chief:0",), "chief:0", now=0.0)
    alone.finished("chief:0")
    assert alone.job_over() == "the chief finished"
