"""Peer: TensorFlow 1-style graph mode (`tf.compat.v1`) on MNIST, the way the seed program of
distributed TensorFlow trains: between-graph replication with `replica_device_setter`
(variables round-robin over the ps tasks), feed_dict batches, a `MonitoredSession`, and
`--sync` for `SyncReplicasOptimizer` (2 gradients averaged per step).

    TF_CONFIG=... python bench/peers/tf1_graph.py --model softmax --steps 3000 --data DIR [--sync]

ps tasks serve until they are killed (TensorFlow's design). The session is
`MonitoredTrainingSession(checkpoint_dir=None)` spelled out, with one change: a non-chief
polls for the chief's initialization every 0.5 s instead of every 30 s (as
examples/tf/seed_tf1.py does), so the second worker does not idle half a minute.
"""

from __future__ import annotations

import os
import time

import peerlib  # first: thread settings

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1


class FastWorkerSessionCreator(tf1.train.SessionCreator):
    def __init__(self, master: str, config) -> None:
        self._master, self._config = master, config

    def create_session(self):
        scaffold = tf1.train.Scaffold()
        scaffold.finalize()
        manager = tf1.train.SessionManager(
            local_init_op=scaffold.local_init_op, ready_op=scaffold.ready_op,
            ready_for_local_init_op=scaffold.ready_for_local_init_op,
            graph=tf1.get_default_graph(), recovery_wait_secs=0.5)
        return manager.wait_for_session(self._master, config=self._config, max_wait_secs=300)


def build_model(model: str, x):
    """Variables from peerlib.init_params (same initial values as the other systems) and logits."""
    params = {name: tf1.get_variable(name, initializer=value)
              for name, value in peerlib.init_params(model).items()}
    if model == "softmax":
        logits = tf1.matmul(x, params["W"]) + params["b"]
    else:
        hidden = tf1.nn.relu(tf1.matmul(x, params["W1"]) + params["b1"])
        logits = tf1.matmul(hidden, params["W2"]) + params["b2"]
    return params, logits


def main() -> int:
    args = peerlib.parse_args(lambda p: p.add_argument("--sync", action="store_true"))
    tf1.disable_eager_execution()
    cluster_dict, job, index = peerlib.tf_config()
    cluster = tf1.train.ClusterSpec(cluster_dict)
    # TensorFlow's default thread pools: pinning them to 1 made no measurable difference here
    server = tf1.train.Server(cluster, job_name=job, task_index=index)
    if job == "ps":
        server.join()
        return 0

    num_workers = len(cluster_dict["worker"])
    is_chief = index == 0
    data = peerlib.Mnist(args.data)
    shard = peerlib.Shard(data, num_workers, index)
    with tf1.device(tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{index}", cluster=cluster)):
        x = tf1.placeholder(tf1.float32, [None, 784])
        y = tf1.placeholder(tf1.int64, [None])
        params, logits = build_model(args.model, x)
        loss = tf1.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        global_step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.GradientDescentOptimizer(peerlib.LEARNING_RATE[args.model])
        hooks = [tf1.train.StopAtStepHook(last_step=args.steps)]
        if args.sync:
            optimizer = tf1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=num_workers,
                                                        total_num_replicas=num_workers)
            hooks.append(optimizer.make_session_run_hook(is_chief))
        train_op = optimizer.minimize(loss, global_step=global_step)

    config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    creator = (tf1.train.ChiefSessionCreator(master=server.target, config=config) if is_chief
               else FastWorkerSessionCreator(server.target, config))
    examples_per_step = peerlib.BATCH * (num_workers if args.sync else 1)
    reporter = peerlib.Reporter(args.eval_every, examples_per_step, args.max_seconds)
    names = list(params)
    sess = tf1.train.MonitoredSession(session_creator=creator, hooks=hooks)
    while not sess.should_stop() and not reporter.out_of_time():
        bx, by = shard.next()
        _, step = sess.run([train_op, global_step], feed_dict={x: bx, y: by})
        reporter.step(int(step))
        if is_chief and reporter.due(int(step)):
            started = time.monotonic()
            values = dict(zip(names, sess.run([params[n] for n in names])))
            acc = peerlib.accuracy(args.model, values, data.test_x, data.test_y)
            reporter.evaluated(int(step), acc, time.monotonic() - started)
    if is_chief:  # a MonitoredSession refuses to run after should_stop(); the variables live on on the ps
        with tf1.Session(server.target, config=config) as plain:
            values = dict(zip(names, plain.run([params[n] for n in names])))
        peerlib.final(peerlib.accuracy(args.model, values, data.test_x, data.test_y))
    # No sess.close(): with SyncReplicasOptimizer it waits out a 120 s grace period for queue
    # runners blocked on a worker that has stopped, and there is nothing to save.
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # see the end of main()
