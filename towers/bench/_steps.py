"""The training steps the benchmark compares: one optimizer rule, the same model and data."""

import functools
from collections.abc import Callable

import tensorflow as tf

import towers
from towers.bench._models import MODELS, mean_loss

LEARNING_RATE = 0.01
OPTIMIZERS = ("sgd", "momentum", "adam")
Step = Callable[[tuple], tf.Tensor]


def towers_optimizer(name: str) -> towers.Optimizer:
    """The towers optimizer of the benchmark's rule `name`."""
    if name == "adam":
        return towers.Adam(LEARNING_RATE)
    return towers.SGD(LEARNING_RATE, momentum=0.9 if name == "momentum" else 0.0)


class HandUpdate:
    """The same rule written by hand, as a peer would: TensorFlow's fused kernels directly."""

    def __init__(self, name: str, variables: list[tf.Variable]):
        self.name, self.variables = name, list(variables)
        self.slots = {}
        if name != "sgd":
            for var in self.variables:
                with tf.device(var.device):
                    self.slots[var.ref()] = [
                        tf.Variable(tf.zeros_like(var), trainable=False)
                        for _ in range(2 if name == "adam" else 1)
                    ]
        with tf.device("/cpu:0"):
            self.steps = tf.Variable(0.0, trainable=False)

    def apply(self, grads: list) -> None:
        """One update of every variable with its gradient."""
        t = self.steps.assign_add(1.0)
        lr = tf.constant(LEARNING_RATE)
        for var, grad in zip(self.variables, grads):
            slots = self.slots.get(var.ref())
            if self.name == "sgd":
                tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
            elif self.name == "momentum":
                tf.raw_ops.ResourceApplyMomentum(
                    var=var.handle, accum=slots[0].handle, lr=lr, grad=grad, momentum=0.9
                )
            else:
                tf.raw_ops.ResourceApplyAdam(
                    var=var.handle,
                    m=slots[0].handle,
                    v=slots[1].handle,
                    beta1_power=tf.pow(0.9, t),
                    beta2_power=tf.pow(0.999, t),
                    lr=lr,
                    beta1=0.9,
                    beta2=0.999,
                    epsilon=1e-7,
                    grad=grad,
                )


def one_device(model_name: str, devices: list[str], optimizer: str = "sgd") -> Step:
    """The whole batch on the first device: the floor on shared cores."""
    with tf.device(devices[0]):
        model = MODELS[model_name]()
        update = HandUpdate(optimizer, model.trainable_variables)

    @tf.function
    def step(batch):
        with tf.device(devices[0]):
            with tf.GradientTape() as tape:
                loss = mean_loss(model, batch)
            update.apply(tape.gradient(loss, model.trainable_variables))
        return loss

    return step


def hand_written(model_name: str, devices: list[str], optimizer: str = "sgd") -> Step:
    """The TF1 recipe by hand: split on the CPU, one tower per device, mean on the CPU."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
        update = HandUpdate(optimizer, model.trainable_variables)
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
            update.apply([tf.add_n(grads) / k for grads in zip(*tower_grads)])
            return tf.add_n(losses) / k

    return step


def towers_parameter_server(model_name: str, devices: list[str], optimizer: str = "sgd") -> Step:
    """`towers.train_step` with the model's variables on the CPU."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
    optimizer = towers_optimizer(optimizer)
    loss_fn = functools.partial(mean_loss, model)
    return tf.function(
        lambda batch: towers.train_step(loss_fn, model, optimizer, batch, devices)[0]
    )


def towers_replicated(
    model_name: str,
    devices: list[str],
    algorithm: str,
    bucket_bytes: int | None = 4 * 2**20,
    optimizer: str = "sgd",
) -> Step:
    """`towers.train_step` with `Replicated` variables and the given all-reduce."""
    replicas = towers.Replicated(
        MODELS[model_name], devices, all_reduce=algorithm, bucket_bytes=bucket_bytes
    )
    optimizer = towers_optimizer(optimizer)

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
    optimizer: str = "sgd",
) -> dict[str, Callable[[str, list[str]], Step]]:
    """The steps to compare, by row label.

    MirroredStrategy's only with a `strategy` and plain SGD (its update is written inline).
    """
    steps = {
        "one device": functools.partial(one_device, optimizer=optimizer),
        "hand-written towers": functools.partial(hand_written, optimizer=optimizer),
        "towers ps": functools.partial(towers_parameter_server, optimizer=optimizer),
    }
    if strategy is not None and optimizer == "sgd":
        steps["mirrored strategy"] = functools.partial(mirrored, strategy=strategy)
    for algorithm in algorithms:
        steps[f"towers replicated {algorithm}"] = functools.partial(
            towers_replicated, algorithm=algorithm, bucket_bytes=bucket_bytes, optimizer=optimizer
        )
    return steps
