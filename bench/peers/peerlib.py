"""What every peer program shares: flags, MNIST, data shards, the models' numpy evaluation and
the lines the harness reads. Runs in the peers' virtualenv, so it imports neither shoal nor
bench (the peer programs import it as a sibling module: their folder is on sys.path).

Import this module before numpy, TensorFlow or torch: it pins every task to one BLAS/OpenMP
thread, as Shoal's examples do (several tasks share 2 cores; spinning idle threads cost more
than they give).

Lines printed (one per event, flushed; the harness timestamps each on arrival):

    step=<global step> examples=<examples this line stands for>   after each training step
    eval_step=<global step> accuracy=<test accuracy> eval_s=<s>   the chief's test evaluation
    accuracy: <test accuracy>                                      the chief's last line
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, not errors

import numpy as np  # noqa: E402

BATCH = 100
LEARNING_RATE = {"softmax": 0.5, "mlp": 0.1}  # the rates of examples/mnist_softmax.py and mnist_mlp_torch.py
HIDDEN = 256
TARGET = 0.90


def parse_args(extra=None, argv=None) -> argparse.Namespace:
    """The flags every peer takes; `extra(parser)` adds a program's own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("softmax", "mlp"), default="softmax")
    parser.add_argument("--steps", type=int, required=True, help="global steps to train")
    parser.add_argument("--data", required=True, help="folder of train_x.npy, train_y.npy, test_x.npy, test_y.npy")
    parser.add_argument("--eval_every", type=int, default=5000,
                        help="examples between test evaluations until TARGET is reached (none after)")
    parser.add_argument("--max_seconds", type=float, default=0.0,
                        help="stop training this long after the first step, even before --steps (0: never)")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


def tf_config() -> tuple[dict, str, int]:
    """(cluster dict, task type, task index) from TF_CONFIG."""
    config = json.loads(os.environ["TF_CONFIG"])
    return config["cluster"], config["task"]["type"], int(config["task"]["index"])


class Mnist:
    """MNIST as float32 images in [0, 1] and int64 labels, memory-mapped from the .npy cache."""

    def __init__(self, folder: str) -> None:
        def load(name):
            return np.load(os.path.join(folder, f"{name}.npy"), mmap_mode="r")

        self.train_x, self.train_y = load("train_x"), load("train_y")
        self.test_x, self.test_y = np.array(load("test_x")), np.array(load("test_y"))  # writable copies


class Shard:
    """Endless batches of one worker's disjoint shard, reshuffled every epoch: the same
    algorithm as shoal.ShardedBatches (one permutation from seed 0, shard i::n)."""

    def __init__(self, data: Mnist, num_shards: int, index: int, batch: int = BATCH, seed: int = 0) -> None:
        self.data, self.batch, self.seed, self.index = data, batch, seed, index
        self.shard = np.random.default_rng(seed).permutation(len(data.train_y))[index::num_shards]
        self.epoch, self.order, self.pos = -1, np.empty(0, np.int64), 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        if self.pos + self.batch > len(self.order):
            self.epoch += 1
            self.order = np.random.default_rng([self.seed, self.index, self.epoch]).permutation(self.shard)
            self.pos = 0
        idx = np.sort(self.order[self.pos:self.pos + self.batch])
        self.pos += self.batch
        return np.ascontiguousarray(self.data.train_x[idx]), np.ascontiguousarray(self.data.train_y[idx])


def init_params(model: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial values: softmax all zeros (the seed program); the MLP like torch's nn.Linear
    default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases."""
    if model == "softmax":
        return {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}
    rng = np.random.default_rng(seed)

    def uniform(fan_in, shape):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    return {"W1": uniform(784, (784, HIDDEN)), "b1": uniform(784, HIDDEN),
            "W2": uniform(HIDDEN, (HIDDEN, 10)), "b2": uniform(HIDDEN, 10)}


def accuracy(model: str, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of parameters in the layout of init_params, in numpy (one thread)."""
    if model == "softmax":
        logits = x @ params["W"] + params["b"]
    else:
        logits = np.maximum(x @ params["W1"] + params["b1"], 0.0) @ params["W2"] + params["b2"]
    return float((logits.argmax(axis=1) == y).mean())


class Reporter:
    """Prints progress and evaluation lines, and decides when to evaluate: every `every`
    examples until the accuracy reaches TARGET, then no more until the final one (the
    harness leaves evaluation time out of the throughput). Not thread-safe."""

    def __init__(self, every_examples: int, examples_per_step: int, max_seconds: float = 0.0) -> None:
        self.every = max(1, every_examples // examples_per_step)  # in global steps
        self.next_eval = self.every
        self.reached = False
        self.max_seconds = max_seconds
        self.first_step_at: float | None = None

    def step(self, global_step: int, examples: int = BATCH) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.monotonic()
        print(f"step={global_step} examples={examples}", flush=True)

    def due(self, global_step: int) -> bool:
        return not self.reached and global_step >= self.next_eval

    def evaluated(self, global_step: int, acc: float, seconds: float) -> None:
        print(f"eval_step={global_step} accuracy={acc:.4f} eval_s={seconds:.4f}", flush=True)
        self.reached = acc >= TARGET
        while self.next_eval <= global_step:
            self.next_eval += self.every

    def out_of_time(self) -> bool:
        return bool(self.max_seconds) and self.first_step_at is not None and \
            time.monotonic() - self.first_step_at > self.max_seconds


def final(acc: float) -> None:
    print(f"accuracy: {acc:.4f}", flush=True)
    sys.stdout.flush()
