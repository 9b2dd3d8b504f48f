"""The multi-host fixtures do what later SSH and Slurm executor tests rely on."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multihost import procs, registry, requirements
from tests.multihost.network import HostNetwork, netns_exists

PROGRAMS = Path(__file__).parent / "programs"
REPO = Path(__file__).resolve().parents[2]


def probe(address: str, port: int, timeout: float, host=None) -> str:
    """One TCP connect from `host` (None: the root namespace): `data TOKEN`, `timeout`, `refused` ..."""
    argv = [sys.executable, str(PROGRAMS / "tcp_probe.py"), address, str(port), str(timeout)]
    if host is not None:
        argv = host.in_netns(argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 20, check=True).stdout.strip()


@pytest.fixture
def token_server(hosts):
    """(port, token): a server in host1 on 0.0.0.0:port, while the root namespace's 127.0.0.1:port
    is held bound but not listening, so that nothing else can answer there."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    token = secrets.token_hex(8)
    hosts[0].popen([sys.executable, str(PROGRAMS / "tcp_token_server.py"), str(port), token],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.wait_until(lambda: procs.tcp_open(hosts[0].address, port), timeout=15,
                     what=f"token server on {hosts[0].address}:{port}")
    yield port, token
    holder.close()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_ssh_with_the_runs_config_runs_the_command_inside_that_host(hosts, host_network, index):
    host = hosts[index]
    out = subprocess.run(host_network.ssh_argv(host, "ip", "-o", "-4", "addr", "show"),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"inet {host.address}/24" in out
    others = [h.address for h in hosts if h is not host] + [host_network.bridge_address]
    assert not [a for a in others if f"inet {a}/" in out], out


def test_ssh_config_has_a_self_contained_block_per_host(hosts, host_network):
    text = host_network.ssh_config.read_text()
    for host in hosts:
        block = text.split(f"Host {host.name}\n", 1)[1].split("\nHost ", 1)[0]
        for line in (f"HostName {host.address}", f"IdentityFile {host_network.identity}",
                     f"UserKnownHostsFile {host_network.known_hosts}", "BatchMode yes",
                     "StrictHostKeyChecking accept-new", "ConnectTimeout "):
            assert line in block, (host.name, line)


def test_tcp_server_in_host1_is_reachable_from_host2_at_host1s_address(hosts, token_server):
    port, token = token_server
    assert probe(hosts[0].address, port, timeout=5, host=hosts[1]) == f"data {token}"


def test_tcp_server_in_host1_is_not_reachable_at_loopback_from_the_root_namespace(hosts, token_server):
    port, _ = token_server
    assert probe("127.0.0.1", port, timeout=5) == "refused"


def test_netns_pids_holds_only_sshd_after_a_sleep_started_over_ssh_is_killed(hosts, host_network):
    host = hosts[1]
    started = subprocess.run(host_network.ssh_argv(host, "sleep 600 >/dev/null 2>&1 </dev/null & echo $!"),
                             capture_output=True, text=True, timeout=30, check=True)
    pid = int(started.stdout.strip())
    assert pid in host.pids()
    procs.kill_pids([procs.identity(pid)], grace=5)
    procs.wait_until(lambda: host.pids() == [host.sshd_pid], timeout=15,
                     what=f"only sshd left in {host.netns}", detail=lambda: str(host.pids()))


def test_link_down_makes_a_connection_to_the_host_time_out(hosts, token_server):
    port, _ = token_server
    hosts[0].link_down()
    assert probe(hosts[0].address, port, timeout=2, host=hosts[1]) == "timeout"


def test_link_up_after_link_down_makes_the_host_reachable_again(hosts, token_server):
    port, token = token_server
    hosts[0].link_down()
    hosts[0].link_up()
    procs.wait_until(lambda: probe(hosts[0].address, port, timeout=2, host=hosts[1]) == f"data {token}",
                     timeout=20, what=f"{hosts[0].name} reachable again")


def test_shape_puts_tbf_on_both_ends_of_the_link_and_unshape_removes_it(hosts):
    host = hosts[2]

    def qdiscs() -> list[str]:
        return [subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
                for argv in (["tc", "qdisc", "show", "dev", host.veth],
                             ["tc", "-n", host.netns, "qdisc", "show", "dev", "eth0"])]

    host.shape("100mbit")
    assert all("tbf" in q and "100Mbit" in q for q in qdiscs()), qdiscs()
    host.unshape()
    assert not any("tbf" in q for q in qdiscs()), qdiscs()


@pytest.mark.skipif(bool(requirements.hosts_unavailable()), reason=str(requirements.hosts_unavailable()))
def test_close_deletes_namespace_links_sshd_and_work_dir():
    network = HostNetwork()
    try:
        network.start()
        host = network.add_host()
        sshd = procs.identity(host.sshd_pid)
    finally:
        network.close()
    assert not netns_exists(host.netns)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    assert host.veth not in links and network.bridge not in links
    assert procs.identity(sshd[0]) != sshd
    assert not network.workdir.exists() and not network.record.path.exists()


def crash_after_setup(what: str) -> dict:
    """Run programs/crash_after_setup.py: it sets up `what` and dies without teardown; returns what it left."""
    done = subprocess.run([sys.executable, "-m", "tests.multihost.programs.crash_after_setup", what], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout, done.stderr
    left = json.loads(done.stdout)
    assert all(procs.identity(pid) is not None for pid in left["pids"])      # the crash left them running
    return left


def test_clean_stale_deletes_the_hosts_a_crashed_run_left_and_keeps_live_runs(hosts, host_network):
    left = crash_after_setup("hosts")
    assert netns_exists(left["netns"])

    registry.clean_stale()

    assert not netns_exists(left["netns"])
    assert [pid for pid in left["pids"] if procs.identity(pid) is not None] == []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    assert left["veth"] not in links and left["bridge"] not in links
    assert not Path(left["dir"]).exists()
    assert all(netns_exists(h.netns) for h in hosts) and host_network.bridge in links
    assert all(procs.identity(h.sshd_pid) is not None for h in hosts)


def test_clean_stale_stops_the_slurm_daemons_and_jobs_a_crashed_run_left_and_keeps_live_runs(slurm_cluster):
    left = crash_after_setup("slurm")

    registry.clean_stale()

    assert [pid for pid in left["pids"] if procs.identity(pid) is not None] == []
    assert not Path(left["dir"]).exists()
    assert set(slurm_cluster.node_states().values()) == {"idle"}


@pytest.mark.parametrize("node", ["n1", "n2"])
def test_srun_runs_a_step_on_the_requested_node(slurm_cluster, node):
    done = slurm_cluster.run(["srun", "-N1", "-n1", "-w", node, "printenv", "SLURMD_NODENAME"], timeout=60)
    assert done.stdout.strip() == node


def test_scancel_of_a_running_batch_job_empties_squeue_and_kills_its_process(slurm_cluster, tmp_path):
    pid_file = tmp_path / "job.pid"
    submitted = slurm_cluster.run(["sbatch", "--parsable", "-N1", "-w", "n1", "-o", str(tmp_path / "%j.out"),
                                   "--wrap", f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; "
                                             "exec sleep 600"], cwd=tmp_path, timeout=30)
    job = submitted.stdout.strip().split(";")[0]
    procs.wait_until(pid_file.exists, timeout=30, what=f"batch job {job} running",
                     detail=lambda: slurm_cluster.run(["squeue"], check=False).stdout)
    job_process = procs.identity(int(pid_file.read_text()))
    assert job_process is not None and job in slurm_cluster.job_ids()

    slurm_cluster.run(["scancel", job], timeout=30)

    procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=30, what="squeue empty after scancel")
    procs.wait_until(lambda: procs.identity(job_process[0]) != job_process, timeout=15,
                     what=f"job {job}'s process {job_process[0]} gone")
