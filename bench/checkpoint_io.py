"""How long a checkpoint of a ~100 MB model takes to write and to restore, next to the disk.

    python -m bench.checkpoint_io                 # 100 MB of float32 variables, 2 ps, SGD and Adam
    python -m bench.checkpoint_io --mb 400 --json

A real cluster: 2 ps processes on 127.0.0.1 (started by bench/jobrun.py) and this process as the
chief's TrainingSession.

    save      TrainingSession.save_checkpoint(): snapshot every ps over the wire, join the shards,
              write variables + optimizer state as safetensors, sha256 them, fsync, rename.
    restore   a fresh job's start(): find the newest checkpoint, read and verify it, split it
              over the ps tasks and send it, plus one pull of every variable.
    raw disk  the reference, measured in the same run: the same bytes written with numpy.save
              and fsync'ed (write), and read back with numpy.load (read).

Adam keeps two slots per variable (m, v), so its checkpoints hold three times the bytes.
Each figure is the median of `--repeats` interleaved rounds. Not run by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import free_ports, machine, median
from bench.jobrun import Job, Launch, clean_env


def model(total_mb: int) -> dict[str, np.ndarray]:
    """A few layers adding up to `total_mb` MB of float32, like a wide MLP."""
    rows = total_mb * (1 << 20) // 4 // 1024 // 4
    rng = np.random.default_rng(0)
    return {f"layer{i}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(4)}


class PsCluster:
    """Two ps processes (started and killed by bench/jobrun.py) plus this process as the chief.
    Not thread-safe."""

    def __init__(self, secret: str):
        import shoal
        self.shoal = shoal
        self.ports = free_ports(3)
        self.spec = {"ps": [f"127.0.0.1:{p}" for p in self.ports[:2]], "chief": [f"127.0.0.1:{self.ports[2]}"]}
        self.secret = secret
        self.job: Job | None = None

    def start_ps(self) -> None:
        self.stop()
        self.job = Job()
        for i in range(2):
            env = clean_env(os.environ, {"SHOAL_JOB_SECRET": self.secret, "TF_CONFIG": json.dumps(
                {"cluster": self.spec, "task": {"type": "ps", "index": i}})})
            self.job.start(Launch(f"ps:{i}", (
                "-c", "import os, shoal; shoal.Server.for_task(shoal.resolve_cluster_config(None, os.environ), "
                      "secret=shoal.resolve_job_secret(os.environ)).join()"), env))

    def session(self, variables, optimizer, model_dir):
        from shoal.cluster import ClusterConfig, ClusterSpec, TaskId
        from shoal.wire import JobSecret
        config = ClusterConfig(ClusterSpec.from_dict(self.spec), TaskId("chief", 0))
        return self.shoal.TrainingSession(config, variables, optimizer, model_dir=model_dir,
                                          secret=JobSecret(self.secret.encode(), "bench"), request_timeout_s=120,
                                          checkpoints=self.shoal.CheckpointOptions(every_s=None, export=False))

    def stop(self) -> None:
        """Kill the ps processes. Idempotent."""
        if self.job is not None:
            self.job.close()
            self.job = None


def raw_disk(arrays: dict[str, np.ndarray], directory: Path) -> tuple[float, float]:
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for name, a in arrays.items():
        with open(directory / f"{name}.npy", "wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())
    written = time.perf_counter() - started
    started = time.perf_counter()
    for name in arrays:
        np.load(directory / f"{name}.npy")
    read = time.perf_counter() - started
    shutil.rmtree(directory)
    return written, read


def one_round(cluster: PsCluster, variables, optimizer, scratch: Path) -> dict[str, float]:
    model_dir = scratch / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    cluster.start_ps()
    try:
        session = cluster.session(variables, optimizer, model_dir).start()
        session.push({k: np.full_like(v, 1e-3) for k, v in variables.items()})  # optimizer slots are non-zero
        started = time.perf_counter()
        session.save_checkpoint()
        save_s = time.perf_counter() - started
        session.close()
    finally:
        cluster.stop()
    ckpt_bytes = sum(f.stat().st_size for f in (model_dir / "checkpoints").rglob("*") if f.is_file())
    cluster.start_ps()
    try:
        session = cluster.session({k: np.zeros_like(v) for k, v in variables.items()}, optimizer, model_dir)
        started = time.perf_counter()
        session.start()
        restore_s = time.perf_counter() - started
        assert session.global_step == 1
        restored = session.params["layer0.weight"][:2]  # started from zeros: restored means near the originals
        assert 0 < np.abs(restored - variables["layer0.weight"][:2]).max() < 2e-3
        session.close()
    finally:
        cluster.stop()
    slots = 3 if optimizer.name == "adam" else 1
    write_s, read_s = raw_disk({f"{k}.{i}": v for k, v in variables.items() for i in range(slots)}, scratch / "raw")
    return {"save_s": save_s, "restore_s": restore_s, "raw_write_s": write_s, "raw_read_s": read_s,
            "checkpoint_mb": ckpt_bytes / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import shoal
    variables = model(args.mb)
    cluster = PsCluster(secrets.token_hex(16))
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="shoal-ckpt-bench-"))
    results = {}
    try:
        rounds: dict[str, list[dict]] = {"sgd": [], "adam": []}
        for _ in range(args.repeats):
            for name, optimizer in (("sgd", shoal.SGD(0.1)), ("adam", shoal.Adam(1e-3))):
                rounds[name].append(one_round(cluster, variables, optimizer, scratch))
        for name, rs in rounds.items():
            results[name] = {k: round(median([r[k] for r in rs]), 3) for k in rs[0]}
    finally:
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    model_mb = sum(v.nbytes for v in variables.values()) / 1e6
    print(f"model: {model_mb:.0f} MB float32 in {len(variables)} variables, 2 ps; median of {args.repeats}")
    print(f"{'optimizer':<10}{'ckpt MB':>9}{'save s':>9}{'raw write s':>13}{'restore s':>11}{'raw read s':>12}"
          f"{'save/raw':>10}{'restore/raw':>13}")
    for name, r in results.items():
        print(f"{name:<10}{r['checkpoint_mb']:>9.0f}{r['save_s']:>9.2f}{r['raw_write_s']:>13.2f}{r['restore_s']:>11.2f}"
              f"{r['raw_read_s']:>12.2f}{r['save_s'] / r['raw_write_s']:>10.2f}{r['restore_s'] / r['raw_read_s']:>13.2f}")
    if args.json:
        print(json.dumps({"machine": machine(), "model_mb": model_mb, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
