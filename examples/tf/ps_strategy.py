"""TF2 `ParameterServerStrategy` on a tiny synthetic regression, unchanged from what
TensorFlow's tutorial does: the chief coordinates, workers and ps run TF servers.

Run it with `shoal train examples/tf/ps_strategy.yaml`: the launcher gives every task its
TF_CONFIG. Worker and ps servers never exit on their own (TensorFlow's design); when the
chief is done, the launcher's teardown stops them.
"""

import argparse
import os

import tensorflow as tf


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            resolver.cluster_spec(), job_name=resolver.task_type,
            task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True,
        )
        print(f"{resolver.task_type}:{resolver.task_id} serving", flush=True)
        server.join()
        return 0

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
    true_w = tf.constant([[1.0], [-2.0], [3.0], [0.5]])

    def dataset_fn():
        x = tf.random.stateless_normal([256, 4], seed=[1, 2])
        y = tf.matmul(x, true_w) + 0.25
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(0.1 * gw)
            b.assign_sub(0.1 * gb)
            return loss

        x, y = next(it)
        return strategy.run(replica_fn, args=(x, y))

    for i in range(1, args.steps + 1):
        loss = coordinator.schedule(step, args=(iterator,))
        if i % 5 == 0 or i == args.steps:
            coordinator.join()
            print(f"step={i} loss={float(loss.fetch()):.5f}", flush=True)
    coordinator.join()
    final = float(tf.reduce_mean(tf.abs(w - true_w)))
    print(f"mean |w - true_w| = {final:.4f}", flush=True)
    model_dir = os.environ.get("OUTPUT_DIR")
    if model_dir:
        with open(os.path.join(model_dir, "result.txt"), "w") as f:
            f.write(f"{final}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
