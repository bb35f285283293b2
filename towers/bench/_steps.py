"""The training steps the benchmark compares, all plain SGD on the same model and data."""

import functools
from collections.abc import Callable

import tensorflow as tf

import towers
from towers.bench._models import MODELS, mean_loss

LEARNING_RATE = 0.01
Step = Callable[[tuple], tf.Tensor]


def one_device(model_name: str, devices: list[str]) -> Step:
    """The whole batch on the first device: the floor on shared cores."""
    with tf.device(devices[0]):
        model = MODELS[model_name]()

    @tf.function
    def step(batch):
        with tf.device(devices[0]):
            with tf.GradientTape() as tape:
                loss = mean_loss(model, batch)
            grads = tape.gradient(loss, model.trainable_variables)
            for var, grad in zip(model.trainable_variables, grads):
                var.assign_sub(LEARNING_RATE * grad)
        return loss

    return step


def hand_written(model_name: str, devices: list[str]) -> Step:
    """The TF1 recipe by hand: split on the CPU, one tower per device, mean on the CPU."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
    k = len(devices)

    @tf.function
    def step(batch):
        with tf.device("/cpu:0"):
            xs, ys = tf.split(batch[0], k), tf.split(batch[1], k)
        tower_grads, losses = [], []
        for i, device in enumerate(devices):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                with tf.GradientTape() as tape:
                    loss = mean_loss(model, (xs[i], ys[i]))
                tower_grads.append(tape.gradient(loss, model.trainable_variables))
                losses.append(loss)
        with tf.device("/cpu:0"):
            for var, *grads in zip(model.trainable_variables, *tower_grads):
                var.assign_sub(LEARNING_RATE * tf.add_n(grads) / k)
            return tf.add_n(losses) / k

    return step


def towers_parameter_server(model_name: str, devices: list[str]) -> Step:
    """`towers.train_step` with the model's variables on the CPU."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
    optimizer = towers.SGD(LEARNING_RATE)
    loss_fn = functools.partial(mean_loss, model)
    return tf.function(
        lambda batch: towers.train_step(loss_fn, model, optimizer, batch, devices)[0]
    )


def towers_replicated(
    model_name: str, devices: list[str], algorithm: str, bucket_bytes: int | None = 4 * 2**20
) -> Step:
    """`towers.train_step` with `Replicated` variables and the given all-reduce."""
    replicas = towers.Replicated(
        MODELS[model_name], devices, all_reduce=algorithm, bucket_bytes=bucket_bytes
    )
    optimizer = towers.SGD(LEARNING_RATE)

    def loss_fn(shard):
        return mean_loss(replicas.local(), shard)

    return tf.function(
        lambda batch: towers.train_step(loss_fn, replicas, optimizer, batch, devices)[0]
    )


def mirrored(model_name: str, devices: list[str], strategy: tf.distribute.Strategy) -> Step:
    """`tf.distribute.MirroredStrategy` in a custom loop: what a peer would write instead.

    One strategy serves every model of a process: two MirroredStrategy objects on the same
    devices reuse the same collective keys and their all-reduces collide.
    """
    with strategy.scope():
        model = MODELS[model_name]()
    k = len(devices)

    def apply(distribution, grads):
        for var, grad in zip(model.trainable_variables, grads):
            distribution.extended.update(
                var, lambda v, g: v.assign_sub(LEARNING_RATE * g), args=(grad,)
            )

    def replica_step(shard):
        with tf.GradientTape() as tape:
            loss = mean_loss(model, shard)
        grads = tape.gradient(loss, model.trainable_variables)
        context = tf.distribute.get_replica_context()
        grads = context.all_reduce("mean", grads)
        context.merge_call(apply, args=(grads,))
        return loss

    @tf.function
    def step(batch):
        shards = (tf.split(batch[0], k), tf.split(batch[1], k))
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda ctx: (
                shards[0][ctx.replica_id_in_sync_group],
                shards[1][ctx.replica_id_in_sync_group],
            )
        )
        losses = strategy.run(replica_step, args=(per_replica,))
        return strategy.reduce("mean", losses, axis=None)

    return step


def configurations(
    algorithms: list[str],
    bucket_bytes: int | None = 4 * 2**20,
    strategy: tf.distribute.Strategy | None = None,
) -> dict[str, Callable[[str, list[str]], Step]]:
    """The steps to compare, by row label; MirroredStrategy's only with a `strategy`."""
    steps = {
        "one device": one_device,
        "hand-written towers": hand_written,
        "towers ps": towers_parameter_server,
    }
    if strategy is not None:
        steps["mirrored strategy"] = functools.partial(mirrored, strategy=strategy)
    for algorithm in algorithms:
        steps[f"towers replicated {algorithm}"] = functools.partial(
            towers_replicated, algorithm=algorithm, bucket_bytes=bucket_bytes
        )
    return steps
