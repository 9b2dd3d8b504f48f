"""Hosts of a job (spec, --hosts, --hostfile) and which task goes where."""

import pytest

from shoal.cluster import TaskId
from shoal.launch.errors import PlanError, SpecError
from shoal.launch.hosts import Host, is_local, parse_hostfile, parse_hosts_flag, place_tasks
from shoal.launch.spec import spec_from_dict


def tasks(ps, workers, chief=False):
    return ([TaskId("ps", i) for i in range(ps)] + ([TaskId("chief", 0)] if chief else [])
            + [TaskId("worker", i) for i in range(workers)])


def where(placement):
    return {str(t): h.name for t, h in placement.items()}


def test_hostfile_lines_comments_and_slots():
    text = "# the seed's machines\nnode1 slots=1\n\nuser@10.0.0.3   # a comment\nnode2 slots=4\n"
    assert parse_hostfile(text, "hosts.txt") == (Host("node1", 1), Host("user@10.0.0.3"), Host("node2", 4))


@pytest.mark.parametrize("text, match", [
    ("node1 gpus=4\n", r"line 1: 'gpus=4' is not slots=N"),
    ("node1\nnode1\n", "listed twice"),
    ("# nothing\n", "lists no hosts"),
    ("node1 slots=0\n", "slots=0"),
    ("-oProxyCommand=x\n", "is not a host name"),
])
def test_bad_hostfile_is_a_spec_error_naming_the_problem(text, match):
    with pytest.raises(SpecError, match=match):
        parse_hostfile(text, "hosts.txt")


def test_hosts_flag_takes_names_and_optional_slots():
    assert parse_hosts_flag("a, b:2,c") == (Host("a"), Host("b", 2), Host("c"))


def test_localhost_alone_is_this_machine():
    assert is_local(()) and is_local((Host("localhost"),))
    assert not is_local((Host("localhost"), Host("node2")))


def test_seed_job_puts_the_ps_on_the_first_host_and_a_worker_on_each_other():
    hosts = (Host("h1"), Host("h2"), Host("h3"))
    assert where(place_tasks(tasks(1, 2), hosts)) == {"ps:0": "h1", "worker:0": "h2", "worker:1": "h3"}
    assert where(place_tasks(tasks(2, 2), hosts)) == {"ps:0": "h1", "ps:1": "h2", "worker:0": "h3",
                                                      "worker:1": "h1"}


def test_slots_cap_the_training_tasks_of_a_host():
    hosts = (Host("h1", 1), Host("h2", 3))
    placed = where(place_tasks(tasks(1, 4), hosts))
    assert [placed[f"worker:{i}"] for i in range(4)] == ["h2", "h1", "h2", "h2"]
    with pytest.raises(PlanError, match="no free slot"):
        place_tasks(tasks(1, 5), hosts)


def test_a_role_pinned_to_hosts_stays_on_them():
    hosts = (Host("big"), Host("h2"), Host("h3"))
    placed = where(place_tasks(tasks(2, 2), hosts, {"ps": ["big"]}))
    assert placed["ps:0"] == placed["ps:1"] == "big"
    with pytest.raises(PlanError, match="roles.ps.hosts names 'nope'"):
        place_tasks(tasks(1, 1), hosts, {"ps": ["nope"]})


def test_spec_hosts_take_names_or_maps_and_roles_may_pin():
    spec = spec_from_dict({"name": "j", "run": "python t.py", "hosts": ["h1", {"name": "h2", "slots": 2}],
                           "roles": {"ps": {"count": 1, "hosts": ["h1"]}, "worker": {"count": 2}}})
    assert spec.host_list() == (Host("h1"), Host("h2", 2)) and spec.pinned_hosts() == {"ps": ["h1"]}


def test_spec_with_a_bad_host_name_is_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"hosts.*'a b' is not a host name"):
        spec_from_dict({"name": "j", "run": "python t.py", "hosts": ["a b"], "roles": {"worker": {"count": 1}}})
