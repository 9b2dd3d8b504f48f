"""The replica ring follows the placement history (issue 14) with real processes: a ps that joined
the running job sends its replicas to its successor in the grown ring (ps:0), so when it is killed
with SIGKILL and started again the chief rebuilds it from that replica, not from a checkpoint or
its own copy of the variables."""

import re

from tests.cluster.harness import free_ports

ARGV = ["tests/cluster/programs/digits.py", "--steps", "600", "--step_sleep", "0.02", "--replicate_every_secs", "1"]


def _replicated_steps(log: str, to: int) -> list[int]:
    return [int(s) for s in re.findall(rf"replicated step (\d+) to ps:{to}\b", log)]


def test_a_ps_that_joined_is_rebuilt_from_the_replica_its_successor_holds(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = [*ARGV, "--out", str(tmp_path)]
    for i in range(2):
        cluster.start("ps", i, argv)
    for i in range(2):
        cluster.start("worker", i, argv)
    spec = dict(cluster.spec, ps=[*cluster.spec["ps"], f"127.0.0.1:{free_ports(1)[0]}"])
    chief = cluster.tasks[2]
    chief.wait_for_output("starts at global step", timeout=60)
    ps2 = cluster.start("ps", 2, argv, spec=spec)
    chief.wait_for_output("ps:2 joined:", timeout=60)
    cluster.wait_for(lambda: len(_replicated_steps(ps2.output(), 0)) >= 2, 60, "ps:2 replicated to ps:0 twice")
    ps1 = cluster.tasks[1]
    cluster.wait_for(lambda: len(_replicated_steps(ps1.output(), 2)) >= 1, 60, "ps:1 replicated to ps:2")
    ps2.kill()
    cluster.start("ps", 2, argv, spec=spec)
    codes = cluster.wait_all(timeout=150)
    assert codes == {"ps:0": 0, "ps:1": 0, "ps:2": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    log = chief.output()
    rebuilt = re.search(r"rebuilt ps:2 from the replica ps:0 holds: step (\d+)", log)
    assert rebuilt, log[-3000:]
    assert int(rebuilt.group(1)) > 0
    assert "no usable replica of ps:2" not in log, log[-3000:]
