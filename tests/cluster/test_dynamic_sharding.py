"""Dynamic data sharding on real processes: a worker killed mid-epoch and replaced, and a job
resumed from a checkpoint mid-epoch. The ps's counts are checked against the positions every
worker logged after each applied push (an independent record)."""

import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

PROGRAM = "tests/cluster/programs/leased_digits.py"
N = 1797  # sklearn's digits


def logged_positions(out: Path, pattern: str = "*.used") -> Counter:
    counts = Counter()
    for f in out.glob(pattern):
        for line in f.read_text().splitlines():
            counts.update(int(p) for p in line.split())
    return counts


def epoch_summary(ps_log: str, epoch: int) -> tuple[int, int, int]:
    m = re.search(rf"epoch {epoch} complete: (\d+) positions consumed exactly once, (\d+) requeued, (\d+) lost",
                  ps_log)
    assert m, ps_log[-3000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_killed_and_replaced_worker_every_position_is_consumed_exactly_once(make_cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cluster = make_cluster(num_ps=2, num_workers=2)
    argv = [PROGRAM, "--epochs", "1", "--step_sleep", "0.1", "--out", str(out)]
    cluster.start_all(argv)
    victim = cluster.tasks[3]
    victim.wait_for_output("pushed 4\n", timeout=60)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    cluster.start("worker", 1, argv)  # the replacement: same task, same TF_CONFIG
    cluster.wait_all(timeout=120)
    assert [t.proc.returncode for t in cluster.tasks] == [0, 0, 0, -signal.SIGKILL, 0], cluster.dump()
    ps0 = cluster.tasks[0].output()
    consumed, requeued, lost = epoch_summary(ps0, 0)
    assert (consumed, lost) == (N, 0)
    assert "worker:1 restarted" in ps0 and requeued > 0, ps0[-3000:]  # the victim's leases went back
    seen = logged_positions(out)
    assert max(seen.values()) == 1, [p for p, k in seen.items() if k > 1][:10]  # no position used twice
    missing = set(range(N)) - set(seen)
    assert len(missing) <= 16, sorted(missing)  # at most the victim's last push, applied but not logged


def test_resumed_job_continues_the_epoch_at_the_saved_position(make_cluster, tmp_path):
    model_dir = tmp_path / "model"
    first_out, second_out = tmp_path / "a", tmp_path / "b"
    first_out.mkdir()
    second_out.mkdir()
    first = make_cluster(num_ps=2, num_workers=1)
    first.start_all([PROGRAM, "--steps", "20", "--out", str(first_out), "--model_dir", str(model_dir)])
    assert set(first.wait_all(timeout=90).values()) == {0}, first.dump()
    before = logged_positions(first_out)
    assert sum(before.values()) == 20 * 16

    second = make_cluster(num_ps=2, num_workers=2)  # rescaled: 2 workers now
    second.start_all([PROGRAM, "--epochs", "1", "--out", str(second_out), "--model_dir", str(model_dir)])
    assert set(second.wait_all(timeout=90).values()) == {0}, second.dump()
    ps0 = second.tasks[0].output()
    assert "restored the lease book: epoch 0, 320 of 1797 positions consumed" in ps0, ps0[-3000:]
    assert epoch_summary(ps0, 0) == (N, 0, 0)
    after = logged_positions(second_out)
    assert max(after.values()) == 1
    assert set(after) == set(range(N)) - set(before)  # the rest of the epoch, not from 0


@pytest.mark.parametrize("spread", [False, True], ids=["on-ps0", "over-both-ps"])
def test_sync_workers_with_epochs_train_the_tail_of_the_last_epoch_together(make_cluster, tmp_path, spread):
    """In sync mode without backup workers a step needs every worker's gradient. Near the end of
    the last epoch asked for, one worker held the last lease while the other, with nothing free
    to lease, waited for those positions (up to 300 s, then LeaseWaitError), and the first waited
    for its gradient: neither moved (the job failed at the step's request timeout). The worker
    with no data now takes part in the steps with no data, so the other trains the tail;
    every position is consumed once, and the chief's final checkpoint holds the whole epoch (a
    job resumed from it finds nothing left to train)."""
    out, resumed_out, model_dir = tmp_path / "out", tmp_path / "resumed", tmp_path / "model"
    out.mkdir()
    resumed_out.mkdir()
    cluster = make_cluster(num_ps=2, num_workers=2)
    spreading = ["--round_robin"] if spread else []  # W on one ps, b on the other: an empty push to each
    cluster.start_all([PROGRAM, "--sync", "--epochs", "1", "--out", str(out), "--model_dir", str(model_dir),
                       *spreading])
    codes = cluster.wait_all(timeout=60)
    assert codes == {"ps:0": 0, "ps:1": 0, "worker:0": 0, "worker:1": 0}, cluster.dump()
    assert epoch_summary(cluster.tasks[0].output(), 0) == (N, 0, 0), cluster.tasks[0].output()[-3000:]
    seen = logged_positions(out)
    assert set(seen) == set(range(N)) and max(seen.values()) == 1, sorted(set(range(N)) - set(seen))[:10]
    if spread:
        assert "ps:1 holds 1 shard (" in cluster.tasks[1].output(), cluster.tasks[1].output()[-2000:]
    idled = [t.name for t in cluster.tasks[2:] if "takes part in the sync steps with no data" in t.output()]
    assert idled, cluster.dump()  # the tail happened, and was trained through

    resumed = make_cluster(num_ps=2, num_workers=2)
    resumed.start_all([PROGRAM, "--sync", "--epochs", "1", "--out", str(resumed_out), "--model_dir", str(model_dir),
                       *spreading])
    assert set(resumed.wait_all(timeout=60).values()) == {0}, resumed.dump()
    assert not logged_positions(resumed_out), resumed.dump()  # the final checkpoint had the whole epoch
