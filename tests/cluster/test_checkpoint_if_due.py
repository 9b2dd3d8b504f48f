"""`TrainingSession.checkpoint_if_due` (a coordinating chief that never pushes) with real ps
processes: it returns True exactly when it saved a periodic checkpoint."""

import shoal
from shoal.train.options import CheckpointOptions
from tests.cluster.ps_process import config_for, grads, secret_of, start_ps, variables


def test_checkpoint_if_due_returns_true_exactly_when_it_saved(make_cluster, tmp_path):
    cluster = make_cluster(num_ps=1, num_workers=1, chief=True)
    start_ps(cluster)
    secret = secret_of(cluster)
    with shoal.TrainingSession(config_for(cluster, "chief", 0), variables(), shoal.SGD(0.1), secret=secret,
                               model_dir=tmp_path / "model", init_timeout_s=30,
                               checkpoints=CheckpointOptions(every_steps=2, every_s=None)) as chief:
        with shoal.TrainingSession(config_for(cluster, "worker", 0), variables(), shoal.SGD(0.1), secret=secret,
                                   init_timeout_s=30) as worker:
            seen = []
            for _ in range(4):
                worker.push(grads())
                before = chief.checkpointer.saves
                due = chief.checkpoint_if_due()
                seen.append((chief.global_step, due, chief.checkpointer.saves - before))
            again = chief.checkpoint_if_due()
    assert seen == [(1, False, 0), (2, True, 1), (3, False, 0), (4, True, 1)]
    assert again is False
