"""HostRepairs: a lost host's repair runs in the background, one per host, its error handed
to the next start once; real threads, bounded waits."""

from __future__ import annotations

import threading

import pytest

from shoal.launch import host_repairs
from shoal.launch.errors import HostUnreachableError, StartDeferred, StartError
from shoal.launch.host_repairs import HostRepairs

pytestmark = pytest.mark.timeout(30)


class Host:
    """A host whose repair blocks until `release`, then makes it usable or raises `error`."""

    def __init__(self, error=None) -> None:
        self.usable = False
        self.error = error
        self.release = threading.Event()
        self.runs = 0
        self.threads: list[threading.Thread] = []

    def repair(self) -> None:
        self.runs += 1
        self.threads.append(threading.current_thread())
        assert self.release.wait(10)
        if self.error is not None:
            raise self.error
        self.usable = True


def ensure(repairs: HostRepairs, host: Host) -> None:
    repairs.ensure("host2", "t.worker.1", host.repair, "connecting again to restart worker.1",
                   usable=lambda: host.usable)


def wait_for(predicate) -> None:
    for _ in range(500):
        if predicate():
            return
        threading.Event().wait(0.01)
    raise AssertionError("not within 5 s")


def repaired(error=None) -> tuple[HostRepairs, Host]:
    """A host whose first repair, started and waited for, ended well or, given, with `error`."""
    repairs, host = HostRepairs(lambda text: None), Host(error)
    with pytest.raises(StartDeferred):
        ensure(repairs, host)
    host.release.set()
    wait_for(lambda: host.usable if error is None else not host.threads[0].is_alive())
    return repairs, host


def test_a_repair_runs_once_in_the_background_and_the_host_is_usable_after_it():
    notes: list[str] = []
    repairs, host = HostRepairs(notes.append), Host()
    for _ in range(3):  # the first starts the repair; the others find it running
        with pytest.raises(StartDeferred):
            ensure(repairs, host)
    assert host.runs == 1
    assert notes == ["shoal | host2: connecting again to restart worker.1; the job goes on meanwhile"]
    host.release.set()
    wait_for(lambda: host.usable)
    ensure(repairs, host)  # returns: the host is usable
    # The thread that repaired it lives on (what it started dies with it) until close.
    assert host.threads[0].is_alive()
    repairs.close()
    host.threads[0].join(5)
    assert not host.threads[0].is_alive()


@pytest.mark.parametrize("error, raised", [
    (HostUnreachableError("host2: unreachable (Connection timed out)"), HostUnreachableError),
    (StartError("host2: no such workdir /w"), StartError),
])
def test_a_failed_repairs_error_reaches_the_next_start_once_naming_the_task(error, raised):
    repairs, host = repaired(error)
    with pytest.raises(raised) as caught:
        ensure(repairs, host)
    assert type(caught.value) is raised
    assert str(caught.value) == f"t.worker.1 cannot be restarted on host2: {error}"
    with pytest.raises(StartDeferred):  # once: the next start tries a new repair
        ensure(repairs, host)
    assert host.runs == 2
    repairs.close()


def test_an_error_nobody_asked_for_in_time_is_dropped_and_the_host_tried_again(monkeypatch):
    repairs, host = repaired(HostUnreachableError("host2: unreachable"))
    monkeypatch.setattr(host_repairs, "STALE_S", 0.0)
    with pytest.raises(StartDeferred):
        ensure(repairs, host)
    assert host.runs == 2
    repairs.close()


def test_after_close_no_repair_starts():
    repairs, host = HostRepairs(lambda text: None), Host()
    repairs.close()
    with pytest.raises(StartError, match="the job is being stopped") as caught:
        ensure(repairs, host)
    assert not isinstance(caught.value, StartDeferred)
    assert host.runs == 0


def test_a_reconnection_lost_again_before_any_task_used_it_fails_the_start_instead_of_repairing_again():
    repairs, host = repaired()
    host.usable = False  # the new agent is lost before the supervisor asked again
    with pytest.raises(HostUnreachableError) as caught:
        ensure(repairs, host)
    assert not isinstance(caught.value, StartDeferred)  # counts as a restart: a flapping host uses them up
    assert str(caught.value) == ("t.worker.1 cannot be restarted on host2: the agent it was reconnected to was"
                                 " lost as well, before the task could start there")
    assert host.runs == 1
    with pytest.raises(StartDeferred):  # the next restart repairs again
        ensure(repairs, host)
    assert host.runs == 2
    repairs.close()


def test_a_reconnection_a_task_used_is_not_held_against_a_later_loss():
    repairs, host = repaired()
    ensure(repairs, host)  # the task starts on it
    host.usable = False  # lost much later, while the task ran
    host.release.clear()
    with pytest.raises(StartDeferred):  # a new repair, not "lost before the task could start"
        ensure(repairs, host)
    assert host.runs == 2
    host.release.set()
    repairs.close()


def test_a_bug_in_a_repair_reaches_the_start_with_its_type_and_is_logged(caplog):
    repairs, host = repaired(KeyError("host2"))
    with pytest.raises(StartError, match=r"^t.worker.1 cannot be restarted on host2: KeyError: 'host2'$"):
        ensure(repairs, host)
    assert any(r.exc_info and "repairing host2 failed" in r.getMessage() for r in caplog.records)
    repairs.close()
