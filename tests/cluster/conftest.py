import pytest

from tests.cluster.harness import LocalCluster


@pytest.fixture
def make_cluster(tmp_path):
    """Factory of LocalClusters; every process they started is killed after the test."""
    clusters = []

    def make(num_ps: int, num_workers: int, chief: bool = False, log_level: str | None = None) -> LocalCluster:
        c = LocalCluster(tmp_path, num_ps, num_workers, chief, log_level)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.kill_all()
