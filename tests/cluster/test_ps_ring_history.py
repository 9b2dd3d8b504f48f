"""The replica ring follows the placement history (issue 14) with real processes: a ps that joined
the running job sends its replicas to its successor in the grown ring (ps:0), and after a ps was
re-homed its predecessor sends to the next live ps; so a ps killed with SIGKILL and started again
is rebuilt by the chief from the replica its successor holds, not from its own copy of the
variables."""

import re
import time

from tests.cluster.harness import free_ports

ARGV = ["tests/cluster/programs/digits.py", "--steps", "1500", "--step_sleep", "0.02", "--replicate_every_secs", "1"]


def _replicated_steps(log: str, to: int) -> list[int]:
    return [int(s) for s in re.findall(rf"replicated step (\d+) to ps:{to}\b", log)]


def _wait_while(tasks, predicate, timeout: float, what: str, cluster) -> None:
    """Poll `predicate()` until true; fail naming `what` after `timeout` s or once one of `tasks` ended."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout}s\n{cluster.dump()}"
        assert all(t.proc.poll() is None for t in tasks), f"a task ended early\n{cluster.dump()}"
        time.sleep(0.05)


def test_a_ps_that_joined_is_rebuilt_from_the_replica_its_successor_holds(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=2, log_level="DEBUG")  # a line per replica copy
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


def test_a_ps_whose_successor_was_rehomed_is_rebuilt_from_the_replica_the_next_live_ps_holds(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=3, num_workers=2, log_level="DEBUG")  # a line per replica copy
    argv = [*ARGV, "--out", str(tmp_path), "--rehome_lost_ps", "--ps_recovery_timeout", "8"]
    cluster.start_all(argv)
    ps0, ps1, chief = cluster.tasks[0], cluster.tasks[1], cluster.tasks[3]
    for worker in cluster.tasks[3:]:
        worker.wait_for_output("starts at global step", timeout=60)
    cluster.wait_for(lambda: len(_replicated_steps(ps1.output(), 2)) >= 1, 60, "ps:1 replicated to ps:2")
    ps1.kill()  # never comes back: re-homed; the ring is ps:0 -> ps:2 -> ps:0
    chief.wait_for_output("ps:1 did not come back within 8s", timeout=60)
    survivors = [t for t in cluster.tasks if t is not ps1]
    _wait_while(survivors, lambda: len(_replicated_steps(ps0.output(), 2)) >= 2, 60, "ps:0 replicated to ps:2 twice",
                cluster)
    ps0.kill()
    cluster.start("ps", 0, argv)
    codes = cluster.wait_all(timeout=150)
    assert codes == {"ps:0": 0, "ps:1": -9, "ps:2": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    log = chief.output()
    rebuilt = re.search(r"rebuilt ps:0 from the replica ps:2 holds: step (\d+)", log)
    assert rebuilt, log[-3000:]
    assert "no usable replica of ps:0" not in log, log[-3000:]
