"""The seed of distributed TensorFlow, TF1 style (`tf.compat.v1`): between-graph
replication with `replica_device_setter`, a `Server` per task and
`MonitoredSession`, on a tiny synthetic regression.

The cluster comes from the classic flags (--ps_hosts, --worker_hosts, --job_name,
--task_index) or, when they are absent, from TF_CONFIG — which is what
`shoal train examples/tf/seed_tf1.yaml` gives it. ps tasks serve forever (server.join());
the launcher stops them when every worker is done.
"""

import argparse
import json
import os

import tensorflow as tf

tf1 = tf.compat.v1


def cluster_and_task(args):
    if args.job_name:
        cluster = {"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")}
        return cluster, args.job_name, args.task_index
    config = json.loads(os.environ["TF_CONFIG"])
    return config["cluster"], config["task"]["type"], int(config["task"]["index"])


class FastWorkerSessionCreator(tf1.train.SessionCreator):
    """WorkerSessionCreator, but polling for the chief's initialization every 0.5 s
    instead of every 30 s, so a tiny job does not idle."""

    def __init__(self, master: str, config: "tf1.ConfigProto") -> None:
        self._master, self._config = master, config

    def create_session(self):
        scaffold = tf1.train.Scaffold()
        scaffold.finalize()
        manager = tf1.train.SessionManager(
            local_init_op=scaffold.local_init_op, ready_op=scaffold.ready_op,
            ready_for_local_init_op=scaffold.ready_for_local_init_op,
            graph=tf1.get_default_graph(), recovery_wait_secs=0.5)
        return manager.wait_for_session(self._master, config=self._config, max_wait_secs=120)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ps_hosts", default="")
    parser.add_argument("--worker_hosts", default="")
    parser.add_argument("--job_name", default="")
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    tf1.disable_eager_execution()
    cluster_dict, job, index = cluster_and_task(args)
    cluster = tf1.train.ClusterSpec(cluster_dict)
    server = tf1.train.Server(cluster, job_name=job, task_index=index)
    if job == "ps":
        print(f"ps:{index} serving", flush=True)
        server.join()
        return 0

    with tf1.device(tf1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{index}", cluster=cluster)):
        x = tf1.random.normal([32, 4], seed=index)
        y = tf1.matmul(x, tf1.constant([[1.0], [-2.0], [3.0], [0.5]])) + 0.25
        w = tf1.get_variable("w", [4, 1], initializer=tf1.zeros_initializer())
        b = tf1.get_variable("b", [1], initializer=tf1.zeros_initializer())
        loss = tf1.reduce_mean(tf1.square(tf1.matmul(x, w) + b - y))
        global_step = tf1.train.get_or_create_global_step()
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)

    hooks = [tf1.train.StopAtStepHook(last_step=args.steps)]
    config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    if index == 0:
        creator = tf1.train.ChiefSessionCreator(master=server.target, config=config)
    else:
        creator = FastWorkerSessionCreator(server.target, config)
    with tf1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
        local = 0
        while not sess.should_stop():
            _, step, value = sess.run([train_op, global_step, loss])
            local += 1
            if local % 10 == 0:
                print(f"step={step} loss={value:.5f}", flush=True)
    print(f"worker:{index} done after {local} local steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
