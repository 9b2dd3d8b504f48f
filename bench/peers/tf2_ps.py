"""Peer: TensorFlow 2 `ParameterServerStrategy` on MNIST, as TensorFlow's tutorial trains: a
chief (the coordinator) schedules `tf.function`s, each running `--steps_per_dispatch` steps of
batch 100 on whichever worker is free, against variables on the ps tasks (round-robin).

    TF_CONFIG=... python bench/peers/tf2_ps.py --model softmax --steps 3000 --data DIR \
        --steps_per_dispatch 10

Workers read MNIST themselves through tf.data, straight from the .npy files
(FixedLengthRecordDataset past the .npy header), shuffled with a 10,000-example buffer;
TensorFlow gives a per-worker dataset no worker index, so workers do not split the data.
Worker and ps servers serve until they are killed (TensorFlow's design). The chief keeps
8 dispatches in flight and prints a progress line each time the oldest one finishes.
"""

from __future__ import annotations

import collections
import os
import time

import peerlib  # first: thread settings

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

IN_FLIGHT = 8


def npy_records(path: str) -> tuple[str, int, int]:
    """(path, header bytes, bytes per row) of a C-order .npy file, to read its rows as records."""
    array = np.load(path, mmap_mode="r")
    return path, array.offset, array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def make_dataset_fn(folder: str):
    xs, ys = (npy_records(os.path.join(folder, f"train_{part}.npy")) for part in ("x", "y"))

    def dataset_fn():
        def decode(x, y):
            return (tf.reshape(tf.io.decode_raw(x, tf.float32), [-1, 784]),
                    tf.reshape(tf.io.decode_raw(y, tf.int64), [-1]))

        pairs = tf.data.Dataset.zip(tuple(tf.data.FixedLengthRecordDataset(path, row, header_bytes=header)
                                          for path, header, row in (xs, ys)))
        return pairs.shuffle(10_000).repeat().batch(peerlib.BATCH, drop_remainder=True).map(decode).prefetch(2)

    return dataset_fn


def logits_of(model: str, params: dict, x):
    if model == "softmax":
        return tf.matmul(x, params["W"]) + params["b"]
    hidden = tf.nn.relu(tf.matmul(x, params["W1"]) + params["b1"])
    return tf.matmul(hidden, params["W2"]) + params["b2"]


def main() -> int:
    args = peerlib.parse_args(lambda p: p.add_argument("--steps_per_dispatch", type=int, default=1))
    _, job, index = peerlib.tf_config()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if job in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=job, task_index=index,
                                      protocol=resolver.rpc_layer or "grpc", start=True)
        server.join()
        return 0

    data = peerlib.Mnist(args.data)
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        params = {name: tf.Variable(value, name=name) for name, value in peerlib.init_params(args.model).items()}
    names = list(params)
    lr = peerlib.LEARNING_RATE[args.model]
    k = args.steps_per_dispatch

    iterator = iter(coordinator.create_per_worker_dataset(make_dataset_fn(args.data)))

    @tf.function
    def train_k(it):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=logits_of(args.model, params, x)))
            grads = tape.gradient(loss, [params[n] for n in names])
            for name, grad in zip(names, grads):
                params[name].assign_sub(lr * grad)
            return loss

        loss = tf.constant(0.0)
        for _ in tf.range(k):
            x, y = next(it)
            loss = strategy.run(replica_fn, args=(x, y))
        return loss

    reporter = peerlib.Reporter(args.eval_every, peerlib.BATCH, args.max_seconds)
    pending: collections.deque = collections.deque()
    done = 0

    def finish_oldest() -> None:
        nonlocal done
        pending.popleft().fetch()
        done += k
        reporter.step(done, k * peerlib.BATCH)
        if reporter.due(done):
            started = time.monotonic()
            values = {n: params[n].numpy() for n in names}
            acc = peerlib.accuracy(args.model, values, data.test_x, data.test_y)
            reporter.evaluated(done, acc, time.monotonic() - started)

    for _ in range(max(1, args.steps // k)):
        pending.append(coordinator.schedule(train_k, args=(iterator,)))
        if len(pending) > IN_FLIGHT:
            finish_oldest()
        if reporter.out_of_time():
            break
    while pending:
        finish_oldest()
    coordinator.join()
    values = {n: params[n].numpy() for n in names}
    peerlib.final(peerlib.accuracy(args.model, values, data.test_x, data.test_y))
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # the coordinator's threads can hold interpreter exit for a long while
