"""The models suite's configurations: one real model trained by plain SGD, several ways.

Every configuration builds its own copies of the model from one factory (the same weights),
trains on the same global batch with the same rule (`var -= 0.01 * mean gradient`, by
`ResourceApplyGradientDescent`) and returns a `Step`, `step(batch) -> loss`, as
`towers.bench._steps` does. Given a dataset, a step ignores the batch it is called with and
takes the next element of its own pipeline: `tf.data` on the host, MirroredStrategy's
distributed dataset, or `towers.prefetch_to_devices`.
"""

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

import towers
from towers.bench._steps import Step

LEARNING_RATE = 0.01
ModelFactory = Callable[[], Any]  # a fresh Keras model with the shared initial weights
LossFn = Callable[[Any, tuple], tf.Tensor]


def sgd(variables: list, grads: list) -> list[tf.Operation]:
    """Applies var -= LEARNING_RATE * grad to each variable, by TensorFlow's fused kernel."""
    lr = tf.constant(LEARNING_RATE)
    return [
        tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
        for var, grad in zip(variables, grads)
    ]


def loss_and_gradients(model: Any, loss_fn: LossFn, shard: tuple, shards: int = 1):
    """(loss, gradients of `model.trainable_variables`) on one shard.

    With `shards` > 1 the loss is the mean of that many equal slices' losses, each its own
    forward pass (its own batch-norm statistics): what `shards` towers compute together.
    Gradients are dense: an embedding's `IndexedSlices` is converted, so every configuration
    reduces and applies the same dense tensors (as a DDP-style all-reduce does).
    """
    with tf.GradientTape() as tape:
        if shards == 1:
            loss = loss_fn(model, shard)
        else:
            pieces = zip(*(tf.split(t, shards) for t in shard))
            loss = tf.add_n([loss_fn(model, piece) for piece in pieces]) / shards
    grads = tape.gradient(loss, model.trainable_variables)
    return loss, [tf.convert_to_tensor(grad) for grad in grads]


def _fed(step: Step, dataset: tf.data.Dataset | None) -> Step:
    """`step` itself, or with a dataset a `tf.function` feeding it its iterator's next batch."""
    if dataset is None:
        return step
    iterator = iter(dataset)

    @tf.function
    def fed(batch):
        del batch  # the dataset's instead
        return step(next(iterator))

    return fed


def one_device(
    make_model: ModelFactory,
    loss_fn: LossFn,
    device: str,
    *,
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
    shards: int = 1,
) -> Step:
    """The whole batch on `device`, in a `tf.function`; with `jit_compile`, all one XLA cluster.

    With a dataset the XLA step is called from a plain `tf.function` that takes the batch
    (XLA cannot compile the iterator). `shards` > 1: see `loss_and_gradients`.
    """
    with tf.device(device):
        model = make_model()

    def step(batch):
        with tf.device(device):
            loss, grads = loss_and_gradients(model, loss_fn, batch, shards)
            with tf.control_dependencies(sgd(model.trainable_variables, grads)):
                return tf.identity(loss)

    return _fed(tf.function(step, jit_compile=jit_compile), dataset)


def replicated(
    make_model: ModelFactory,
    loss_fn: LossFn,
    devices: list[str],
    *,
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
    split_device: str = "/cpu:0",
) -> Step:
    """A hand-written replicated tower loop: one model copy per device, gradients summed.

    The step is a plain `tf.function`; each tower's loss and gradients, with `jit_compile`, a
    `tf.function(jit_compile=True)` of its own called under `tf.device(device)`. The mean
    gradient is `tf.add_n` on the first device; every copy applies it on its own device.
    """
    copies = []
    for device in devices:
        with tf.device(device):
            copies.append(make_model())
    towers_ = [functools.partial(loss_and_gradients, model, loss_fn) for model in copies]
    if jit_compile:
        towers_ = [tf.function(tower, jit_compile=True) for tower in towers_]
    k = len(devices)

    @tf.function
    def step(batch):
        with tf.device(split_device):
            shards = list(zip(*(tf.split(t, k) for t in batch)))
        losses, tower_grads = [], []
        for i, (device, tower) in enumerate(zip(devices, towers_)):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                loss, grads = tower(shards[i])
            losses.append(loss)
            tower_grads.append(grads)
        with tf.device(devices[0]):
            mean = [tf.add_n(list(grads)) / k for grads in zip(*tower_grads)]
            loss = tf.add_n(losses) / k
        updates = []
        for device, model in zip(devices, copies):
            with tf.device(device):
                updates += sgd(model.trainable_variables, mean)
        with tf.control_dependencies(updates):
            return tf.identity(loss)

    return _fed(step, dataset)


def mirrored(
    make_model: ModelFactory,
    loss_fn: LossFn,
    strategy: tf.distribute.Strategy,
    *,
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
) -> Step:
    """`tf.distribute.MirroredStrategy` in a custom loop, as its guide writes one.

    Each replica computes its loss and gradients (with `jit_compile`, in a
    `tf.function(jit_compile=True)` called inside `strategy.run`), all-reduces them in one
    `ctx.all_reduce("mean", grads)` (a single batched reduction of the whole list) and applies
    them in `merge_call` with `strategy.extended.update`. Fed by
    `strategy.experimental_distribute_dataset` when a dataset is given, else by splitting
    the batch with `experimental_distribute_values_from_function`.
    """
    with strategy.scope():
        model = make_model()
    variables = [var.value for var in model.trainable_variables]  # the MirroredVariables
    tower = functools.partial(loss_and_gradients, model, loss_fn)
    if jit_compile:
        tower = tf.function(tower, jit_compile=True)

    def apply(distribution, grads):
        for var, grad in zip(variables, grads):
            distribution.extended.update(var, lambda v, g: sgd([v], [g]), args=(grad,))

    def replica_step(shard):
        loss, grads = tower(shard)
        context = tf.distribute.get_replica_context()
        context.merge_call(apply, args=(context.all_reduce("mean", grads),))
        return loss

    k = strategy.num_replicas_in_sync
    if dataset is not None:
        iterator = iter(strategy.experimental_distribute_dataset(dataset))

        @tf.function
        def step(batch):
            del batch  # the dataset's instead
            losses = strategy.run(replica_step, args=(next(iterator),))
            return strategy.reduce("mean", losses, axis=None)

        return step

    @tf.function
    def split_step(batch):
        shards = list(zip(*(tf.split(t, k) for t in batch)))
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda ctx: shards[ctx.replica_id_in_sync_group]
        )
        losses = strategy.run(replica_step, args=(per_replica,))
        return strategy.reduce("mean", losses, axis=None)

    return split_step


def towers_step(
    make_model: ModelFactory,
    loss_fn: LossFn,
    devices: list[str],
    *,
    strategy: str = "replicated",
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
    nonfinite: str | None = "default",
) -> Step:
    """`towers.train_step`, `Replicated` or a `ParameterServer` spread over the devices.

    The parameter server's variables are made in the first tower, so that its strategy
    spreads them over the tower devices (least loaded first). With a dataset, the step is
    fed by `towers.prefetch_to_devices`: each tower's shard is on its device before it
    starts. `nonfinite` as `train_step`'s (the default checks every step).
    """
    if strategy == "replicated":
        model = towers.Replicated(make_model, devices)
        local, variable_strategy = model.local, None
    else:
        variable_strategy = towers.ParameterServer(devices)
        (model,) = towers.replicate(
            lambda _: make_model(), [None], devices[:1], variable_strategy=variable_strategy
        )
        local = functools.partial(lambda m: m, model)
    optimizer = towers.SGD(LEARNING_RATE)

    def step(batch):
        return towers.train_step(
            lambda shard: loss_fn(local(), shard),
            model,
            optimizer,
            batch,
            devices,
            variable_strategy=variable_strategy,
            nonfinite=nonfinite,
            jit_compile=jit_compile,
        )[0]

    if dataset is None:
        return tf.function(step)
    staged = towers.prefetch_to_devices(dataset, devices)

    @tf.function
    def fed(batch):
        del batch  # the staged batch instead
        return step(staged)

    return fed


def model_rows(
    make_model: ModelFactory,
    loss_fn: LossFn,
    devices: list[str],
    strategy: tf.distribute.Strategy | None,
    dataset: tf.data.Dataset,
    *,
    jit_compile: bool,
) -> dict[str, Callable[[], Step]]:
    """The configurations to compare, by row label: each a builder of a fresh `Step`.

    Fed by `dataset` (each its way of staging batches) or, labelled "(tensor)", by the
    batch each call is given (a host tensor). MirroredStrategy's rows only with a
    `strategy` (one per process: two on the same devices reuse collective keys).
    """
    xla = " xla" if jit_compile else ""
    common = dict(loss_fn=loss_fn, jit_compile=jit_compile)
    rows = {
        f"one device{xla}": functools.partial(one_device, device=devices[0], dataset=dataset),
        f"hand-written towers{xla}": functools.partial(
            replicated, devices=devices, dataset=dataset
        ),
        f"towers replicated{xla}": functools.partial(towers_step, devices=devices, dataset=dataset),
        f"towers ps{xla}": functools.partial(
            towers_step, devices=devices, strategy="ps", dataset=dataset
        ),
    }
    if strategy is not None:
        rows[f"mirrored{xla}"] = functools.partial(mirrored, strategy=strategy, dataset=dataset)
    if not jit_compile:  # no compilation: cheap to add, fed by host tensors
        rows["one device (tensor)"] = functools.partial(one_device, device=devices[0])
        rows["towers replicated (tensor)"] = functools.partial(towers_step, devices=devices)
        if strategy is not None:
            rows["mirrored (tensor)"] = functools.partial(mirrored, strategy=strategy)
    else:
        rows["towers replicated xla, no guard"] = functools.partial(
            towers_step, devices=devices, dataset=dataset, nonfinite=None
        )
    return {label: functools.partial(build, make_model, **common) for label, build in rows.items()}
