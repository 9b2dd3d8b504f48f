"""Peer: TensorFlow `MultiWorkerMirroredStrategy` on MNIST: every worker holds all variables,
and each step all-reduces (mean) the gradients of the workers' batches of 100 (ring
collectives over gRPC), then applies them locally. A custom training loop in a
`tf.function`, fed each step with the worker's numpy shard (the same shards as Shoal's).

    TF_CONFIG=... python bench/peers/tf_mwms.py --model softmax --steps 1500 --data DIR

Worker 0 evaluates; both workers run exactly --steps steps (a collective needs everyone, so
there is no --max_seconds here).
"""

from __future__ import annotations

import os
import time

import peerlib  # first: thread settings

import tensorflow as tf  # noqa: E402


def logits_of(model: str, params: dict, x):
    if model == "softmax":
        return tf.matmul(x, params["W"]) + params["b"]
    hidden = tf.nn.relu(tf.matmul(x, params["W1"]) + params["b1"])
    return tf.matmul(hidden, params["W2"]) + params["b2"]


def main() -> int:
    args = peerlib.parse_args()
    cluster, _, index = peerlib.tf_config()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    num_workers = len(cluster["worker"])
    data = peerlib.Mnist(args.data)
    shard = peerlib.Shard(data, num_workers, index)
    with strategy.scope():
        params = {name: tf.Variable(value, name=name) for name, value in peerlib.init_params(args.model).items()}
    names = list(params)
    lr = peerlib.LEARNING_RATE[args.model]

    @tf.function
    def step(x, y):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=logits_of(args.model, params, x)))
            grads = tape.gradient(loss, [params[n] for n in names])
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
            for name, grad in zip(names, grads):
                params[name].assign_sub(lr * grad)
            return loss

        return strategy.run(replica_fn, args=(x, y))

    reporter = peerlib.Reporter(args.eval_every, peerlib.BATCH * num_workers)
    is_chief = index == 0
    for global_step in range(1, args.steps + 1):
        bx, by = shard.next()
        step(tf.constant(bx), tf.constant(by))
        reporter.step(global_step)
        if is_chief and reporter.due(global_step):
            started = time.monotonic()
            values = {n: params[n].numpy() for n in names}
            acc = peerlib.accuracy(args.model, values, data.test_x, data.test_y)
            reporter.evaluated(global_step, acc, time.monotonic() - started)
    if is_chief:
        values = {n: params[n].numpy() for n in names}
        peerlib.final(peerlib.accuracy(args.model, values, data.test_x, data.test_y))
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # collective executors' threads can hold interpreter exit
