"""A tiny deterministic training program for cluster tests: softmax regression on sklearn's
digits in float64. Every task runs it; the role comes from TF_CONFIG. Workers save their final
parameters to OUT/<task>.npz. The batch of replica r at global step t is `batch_for(r, t)`, so
a test can rebuild the joined batch of every synchronous step."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import shoal

BATCH = 16


def load_digits_data():
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.data.astype(np.float64) / 16.0, d.target.astype(np.int64)


def initial_variables():
    rng = np.random.default_rng(0)
    return {"W": rng.normal(0, 0.1, (64, 10)), "b": np.zeros(10)}


def batch_for(replica: int, step: int, n: int) -> np.ndarray:
    return np.random.default_rng([replica, step]).choice(n, BATCH, replace=False)


def loss_and_grad(params, x, y):
    z = x @ params["W"] + params["b"]
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = -np.log(p[rows, y]).mean()
    p[rows, y] -= 1
    p /= len(y)
    return loss, {"W": x.T @ p, "b": p.sum(axis=0)}


OPTIMIZERS = {"sgd": lambda: shoal.SGD(0.5), "adam": lambda: shoal.Adam(0.05),
              "momentum": lambda: shoal.Momentum(0.1, 0.9), "adagrad": lambda: shoal.Adagrad(0.5)}


def kill_ps1_once_replicated(session, step: int, pid_file: Path) -> None:
    """SIGKILL ps:1 once its successor holds its replica of `step` (at most 30 s), and only once."""
    if not pid_file.exists():
        return
    holder = 2 % session.ps.num_ps
    deadline = time.monotonic() + 30
    while session.ps.replica(holder, 1, 5.0).body.step < step:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ps:{holder} did not get ps:1's replica of step {step} within 30s")
        time.sleep(0.02)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    pid_file.unlink()
    print(f"killed ps:1 at step {step}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--replicas_to_aggregate", type=int)
    parser.add_argument("--min_shard_bytes", type=int, default=1024)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step_sleep", type=float, default=0.0, help="seconds of extra 'compute' per step")
    parser.add_argument("--model_dir", type=Path)
    parser.add_argument("--checkpoint_every_steps", type=int)
    parser.add_argument("--ps_recovery_timeout", type=float, default=120)
    parser.add_argument("--heartbeat_timeout", type=float, default=20)
    parser.add_argument("--leave_at", type=int, help="stop training (leave the job, done) at this global step")
    parser.add_argument("--rehome_lost_ps", action="store_true", help="re-home a lost ps that does not come back")
    parser.add_argument("--no_shared_memory", dest="shared_memory", action="store_false",
                        help="push through the socket, not shared memory")
    parser.add_argument("--replicate_every_steps", type=int, help="ps: replicate shards to the next ps every N steps")
    parser.add_argument("--replicate_every_secs", type=float, help="ps: replicate shards to the next ps every N s")
    parser.add_argument("--kill_ps1_at", type=int,
                        help="chief: at this global step, once ps:0 holds ps:1's replica of it, SIGKILL ps:1 "
                             "(its pid is in OUT/ps1.pid) before pushing the step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    config = shoal.resolve_cluster_config(None, os.environ)
    if config.task.job == "ps":
        replication = shoal.ReplicationOptions(every_s=args.replicate_every_secs,
                                               every_steps=args.replicate_every_steps)
        shoal.Server.for_task(config, secret=shoal.resolve_job_secret(os.environ), replication=replication).join()
        return 0
    x, y = load_digits_data()
    sync = shoal.SyncOptions(args.replicas_to_aggregate) if args.sync else False
    dropped = applied = 0
    with shoal.TrainingSession(config, initial_variables(), OPTIMIZERS[args.optimizer](), sync=sync,
                               secret=shoal.resolve_job_secret(os.environ),
                               max_steps=args.steps, min_shard_bytes=args.min_shard_bytes,
                               request_timeout_s=30, model_dir=args.model_dir,
                               checkpoints=shoal.CheckpointOptions(every_steps=args.checkpoint_every_steps),
                               ps_recovery_timeout_s=args.ps_recovery_timeout,
                               heartbeat_timeout_s=args.heartbeat_timeout,
                               rehome_lost_ps=args.rehome_lost_ps, shared_memory=args.shared_memory) as session:
        while not session.should_stop() and not (args.leave_at is not None and session.global_step >= args.leave_at):
            if args.kill_ps1_at is not None and config.is_chief and session.global_step == args.kill_ps1_at:
                kill_ps1_once_replicated(session, args.kill_ps1_at, args.out / "ps1.pid")
            idx = batch_for(config.replica_index, session.global_step, len(y))
            _, result = session.run_step(loss_and_grad, x[idx], y[idx])
            dropped += not result.applied
            applied += result.applied
            time.sleep(args.step_sleep)
        print(f"live_replicas={session.live_replicas}", flush=True)
        session.pull()
        np.savez(args.out / f"{config.task.job}{config.task.index}.npz", dropped=dropped, applied=applied,
                 **session.params)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
