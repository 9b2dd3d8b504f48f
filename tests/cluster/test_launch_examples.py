"""The shipped job specs run unchanged under `shoal train`: the seed MNIST job on Shoal's
runtime, and plain TensorFlow programs (TF2 ParameterServerStrategy, TF1 seed style) —
those are skipped only where tensorflow is not importable (CI installs tensorflow-cpu)."""

import importlib.util
import os
import re
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import alive, cleanup, recorded_pids, run_shoal, start_shoal, status, wait_for  # noqa: E402

needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                              reason="tensorflow is not installed (pip install tensorflow-cpu)")


@pytest.mark.timeout(120)
def test_mnist_yaml_trains_two_workers_and_ps_exit_by_themselves(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "train", "examples/mnist.yaml", "-p", "steps=200", timeout=110)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        for index in (0, 1):
            prefix = f"mnist.worker.{index} | "
            lines = [line for line in text.splitlines() if line.startswith(prefix)]
            assert lines[-1].startswith(f"mnist.worker.{index} | accuracy: 0.")
        [job] = status(home)
        # the step the job trained to, from the workers' final lines (their last regular line
        # is at most 100 local steps, about step 200, and often fewer)
        assert job["state"] == "SUCCEEDED" and job["step"] >= 200, text
        # ... and it is the last step a worker printed: a "final" line, or a regular line when
        # that one fell on the last step (a worker that did no step prints neither)
        printed = [int(s) for s in re.findall(r"^mnist\.worker\.\d \| worker:\d step=(\d+) loss=", text, re.M)]
        assert job["step"] == max(printed), text
        states = {t["name"]: t["state"] for t in job["tasks"]}
        assert states == dict.fromkeys(("ps.0", "ps.1", "worker.0", "worker.1"), "SUCCEEDED"), text
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home)


@needs_tf
@pytest.mark.timeout(180)
def test_tf2_parameter_server_strategy_runs_and_teardown_stops_servers(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "train", "examples/tf/ps_strategy.yaml", timeout=170)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        assert "tf2-ps.chief.0 | step=20 loss=" in text
        [job] = status(home)
        states = {t["name"]: t["state"] for t in job["tasks"]}
        assert states == {"chief.0": "SUCCEEDED", "worker.0": "KILLED", "worker.1": "KILLED",
                          "ps.0": "KILLED"}
        assert float((Path(job["model_dir"]) / "result.txt").read_text()) < 0.1
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home)


@needs_tf
@pytest.mark.timeout(180)
def test_tf1_seed_program_runs_and_ps_is_stopped(tmp_path):
    home = tmp_path / "home"
    try:
        out = run_shoal(home, "train", "examples/tf/seed_tf1.yaml", "-p", "steps=30",
                        timeout=170)
        text = out.stdout.decode()
        assert out.returncode == 0, text
        assert "tf1-seed.worker.0 | worker:0 done" in text
        [job] = status(home)
        assert job["state"] == "SUCCEEDED"
        assert {t["name"]: t["state"] for t in job["tasks"]}["ps.0"] == "KILLED"
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home)


@pytest.mark.timeout(150)
def test_launcher_restarts_a_killed_ps_and_the_mnist_job_recovers(tmp_path):
    """mnist.yaml restarts failed tasks: a ps killed with SIGKILL comes back under the same
    address, the chief rebuilds it from the job's checkpoints, and the job still succeeds. The
    ps killed is ps.0, which holds the softmax (greedy placement keeps its bias with its
    weights) and the lease book."""
    home = tmp_path / "home"
    # 20000 steps (~8 s here): the seed now trains ~2.5k steps/s, and 5000 steps had often ended
    # by the time the kill came (2 of 4 runs: the ps died after the workers finished, no restart)
    proc = start_shoal(home, "train", "examples/mnist.yaml", "-p", "steps=20000")
    try:
        job = wait_for(lambda: next(iter(status(home)), None), 30, "the job record")
        log = Path(job["job_dir"]) / "logs" / "worker.0.log"
        wait_for(lambda: log.exists() and re.search(r"step=([3-9]\d\d|\d{4})", log.read_text()), 60, "step 300")
        ps0 = next(t for t in status(home)[0]["tasks"] if t["name"] == "ps.0")
        os.kill(ps0["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        text = out.decode()
        assert proc.returncode == 0, text
        [job] = status(home)
        assert job["state"] == "SUCCEEDED"
        assert next(t for t in job["tasks"] if t["name"] == "ps.0")["restarts"] == 1
        assert "rebuilt ps:0" in text and "restored checkpoint step=" in text
        accuracies = [float(a) for a in re.findall(r"worker\.\d \| accuracy: (\d\.\d+)", text)]
        assert len(accuracies) == 2 and min(accuracies) >= 0.90, text[-3000:]
        assert alive(recorded_pids(home)) == []
    finally:
        cleanup(home, proc)
