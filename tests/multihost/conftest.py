"""Fixtures for tests across several hosts: network-namespace hosts with sshd, and a local Slurm.

See tests/multihost/README.md. Session-scoped (set up once, ~1 s for the hosts, a few s for
Slurm); after each test that used them, hosts are reset (links up, no shaping, only sshd left)
and leftover Slurm jobs are cancelled. Teardown deletes everything, also after failures; objects
of an earlier run that crashed are deleted when the next run starts.
"""

from __future__ import annotations

import atexit
import os

import pytest

from tests.multihost import requirements
from tests.multihost.host import Host
from tests.multihost.network import HostNetwork
from tests.multihost.slurm import SlurmCluster


@pytest.fixture(scope="session")
def host_network():
    """The run's HostNetwork (bridge, /24, ssh_config, known_hosts, key); `add_host()` makes more hosts."""
    if reason := requirements.hosts_unavailable():
        pytest.skip(reason)
    network = HostNetwork()
    atexit.register(network.close)       # if the session ends without running fixture teardown
    try:
        network.start()
        yield network
    finally:
        network.close()


@pytest.fixture(scope="session")
def hosts(host_network: HostNetwork) -> list[Host]:
    """Three hosts (host1, host2, host3), each a network namespace with its own sshd."""
    return [host_network.add_host() for _ in range(3)]


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running SlurmCluster: munged, slurmctld, slurmd n1 and n2; use `.env` with sbatch/srun/..."""
    if reason := requirements.slurm_unavailable():
        pytest.skip(reason)
    cluster = SlurmCluster(base_env=dict(os.environ))
    atexit.register(cluster.close)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(autouse=True)
def _undo_what_the_test_did_to_hosts_and_slurm(request):
    """After a test that used the session's hosts or Slurm, restore them for the next test."""
    network = request.getfixturevalue("host_network") if "host_network" in request.fixturenames else None
    cluster = request.getfixturevalue("slurm_cluster") if "slurm_cluster" in request.fixturenames else None
    yield
    if network is not None:
        network.reset()
    if cluster is not None:
        cluster.cancel_all()
