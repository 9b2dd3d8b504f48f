"""Hosts from --hosts, a hostfile or the spec, and which task goes to which host (pure)."""

import pytest

from shoal.cluster import TaskId
from shoal.launch.allocation import task_ids
from shoal.launch.errors import PlanError, SpecError
from shoal.launch.hosts import Host, is_local, parse_hostfile, parse_hosts_flag, place_tasks
from shoal.launch.spec import spec_from_dict


def spec(ps=1, workers=2, chief=False, **extra):
    roles = {"ps": {"count": ps}, "worker": {"count": workers}}
    if chief:
        roles["chief"] = {"count": 1}
    for role, hosts in extra.pop("pins", {}).items():
        roles[role]["hosts"] = hosts
    return spec_from_dict({"name": "j", "run": "python t.py", "roles": roles, **extra})


def placed(s, hosts):
    return {str(t): h.name for t, h in place_tasks(task_ids(s), hosts, s.pinned_hosts()).items()}


def test_hosts_flag_takes_names_and_optional_slots():
    assert parse_hosts_flag("a, user@b:4,10.0.0.3") == (Host("a"), Host("user@b", 4), Host("10.0.0.3"))


def test_hosts_flag_refuses_what_ssh_would_read_as_an_option():
    with pytest.raises(SpecError, match="not a host name"):
        parse_hosts_flag("a,-oProxyCommand=touch /tmp/x")


def test_a_host_listed_twice_is_refused():
    with pytest.raises(SpecError, match="listed twice"):
        parse_hosts_flag("a,b,a")


def test_hostfile_lines_are_host_and_slots_with_comments():
    text = "# the seed's machines\nnode1 slots=1\n\nnode2 slots=2  # two workers\nnode3\n"
    assert parse_hostfile(text, "hosts.txt") == (Host("node1", 1), Host("node2", 2), Host("node3"))


def test_hostfile_errors_name_the_file_and_line():
    with pytest.raises(SpecError, match=r"hosts.txt: line 2: 'gpus=2' is not slots=N"):
        parse_hostfile("node1\nnode2 gpus=2\n", "hosts.txt")
    with pytest.raises(SpecError, match="at least 1"):
        parse_hostfile("node1 slots=0\n", "hosts.txt")
    with pytest.raises(SpecError, match="lists no hosts"):
        parse_hostfile("# nothing\n", "hosts.txt")


def test_only_no_hosts_or_localhost_alone_is_local():
    assert is_local(()) and is_local((Host("localhost", 8),))
    assert not is_local((Host("localhost"), Host("node2"))) and not is_local((Host("node1"),))


def test_one_ps_and_two_workers_over_three_hosts_get_a_host_each():
    hosts = (Host("h1"), Host("h2"), Host("h3"))
    assert placed(spec(ps=1, workers=2), hosts) == {"ps:0": "h1", "worker:0": "h2", "worker:1": "h3"}


def test_ps_spread_first_then_workers_go_where_least_runs():
    hosts = (Host("h1"), Host("h2"), Host("h3"))
    assert placed(spec(ps=2, workers=2), hosts) == {"ps:0": "h1", "ps:1": "h2", "worker:0": "h3",
                                                    "worker:1": "h1"}


def test_slots_cap_training_tasks_and_too_few_is_a_plan_error():
    hosts = (Host("h1", 1), Host("h2", 1))
    assert placed(spec(ps=2, workers=2), hosts) == {"ps:0": "h1", "ps:1": "h2", "worker:0": "h1",
                                                    "worker:1": "h2"}
    with pytest.raises(PlanError, match="no free slot"):
        placed(spec(ps=0, workers=3), hosts)


def test_a_role_pinned_to_hosts_stays_on_them():
    hosts = (Host("h1"), Host("h2"), Host("h3"))
    s = spec(ps=2, workers=2, pins={"ps": ["h3"], "worker": ["h1", "h2"]})
    assert placed(s, hosts) == {"ps:0": "h3", "ps:1": "h3", "worker:0": "h1", "worker:1": "h2"}


def test_pinning_a_host_the_job_does_not_list_is_a_plan_error():
    with pytest.raises(PlanError, match="roles.ps.hosts names 'h9'"):
        placed(spec(pins={"ps": ["h9"]}), (Host("h1"),))


def test_spec_hosts_accept_names_and_slots():
    s = spec(hosts=["h1", {"name": "h2", "slots": 2}])
    assert s.host_list() == (Host("h1"), Host("h2", 2))
    assert place_tasks([TaskId("worker", 0)], s.host_list())[TaskId("worker", 0)] == Host("h1")
