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

import tensorflow as tf

import towers
from towers.bench._mirrored_steps import mirrored
from towers.bench._model_rule import (
    LEARNING_RATE,
    LossFn,
    ModelFactory,
    loss_and_gradients,
    sgd,
)
from towers.bench._steps import Step


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
    compile_update: bool = False,
) -> Step:
    """A hand-written replicated tower loop: one model copy per device, gradients summed.

    The step is a plain `tf.function`; each tower's loss and gradients, with `jit_compile`, a
    `tf.function(jit_compile=True)` of its own called under `tf.device(device)`. The mean
    gradient is `tf.add_n` on the first device; every copy applies it on its own device,
    with `compile_update` as a second XLA program per device.
    """
    copies = []
    for device in devices:
        with tf.device(device):
            copies.append(make_model())
    towers_ = [functools.partial(loss_and_gradients, model, loss_fn) for model in copies]
    if jit_compile:
        towers_ = [tf.function(tower, jit_compile=True) for tower in towers_]
    applies = [functools.partial(_applied, model.trainable_variables) for model in copies]
    if compile_update:
        applies = [tf.function(apply, jit_compile=True) for apply in applies]
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
        for device, apply in zip(devices, applies):
            with tf.device(device):
                updates.append(apply(mean))
        with tf.control_dependencies(updates):
            return tf.identity(loss)

    return _fed(step, dataset)


def _applied(variables: list, grads: list) -> tf.Tensor:
    """`sgd`, as a value to wait for (what a compiled update returns)."""
    with tf.control_dependencies(sgd(variables, grads)):
        return tf.constant(True)


def towers_stages(
    make_model: ModelFactory,
    loss_fn: LossFn,
    devices: list[str],
    *,
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
) -> Step:
    """`train_step`'s stages written out (`Replicated`): towers compiled, the update not.

    `towers.tower_gradients(..., jit_compile=True)` in each tower, then
    `towers.apply_replicated` (its update uncompiled, the default non-finite guard): what
    `train_step(..., jit_compile=True)` did before its update was compiled.
    """
    model = towers.Replicated(make_model, devices)
    optimizer = towers.SGD(LEARNING_RATE)
    staged = None if dataset is None else towers.prefetch_to_devices(dataset, devices)

    def tower(shard):
        loss, _, grads = towers.tower_gradients(
            lambda s: loss_fn(model.local(), s), model, shard, jit_compile=jit_compile
        )
        return loss, grads

    @tf.function
    def step(batch):
        if staged is None:
            shards = towers.ops.split_batch(batch, len(devices))
            sizes = towers.ops.shard_sizes(batch, len(devices))
        else:
            shards, sizes = staged.take()
        losses, grads = zip(*towers.replicate(tower, shards, devices, variable_strategy=model))
        updates = towers.apply_replicated(model, list(grads), sizes, optimizer)
        with tf.control_dependencies(updates):
            return tf.add_n(list(losses)) / len(devices)

    return step


def towers_step(
    make_model: ModelFactory,
    loss_fn: LossFn,
    devices: list[str],
    *,
    strategy: str = "replicated",
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
    nonfinite: str | None = "default",
    replicated: dict | None = None,
) -> Step:
    """`towers.train_step`, `Replicated` or a `ParameterServer` spread over the devices.

    The parameter server's variables are made in the first tower, so that its strategy
    spreads them over the tower devices (least loaded first). With a dataset, the step is
    fed by `towers.prefetch_to_devices`: each tower's shard is on its device before it
    starts. `nonfinite` as `train_step`'s (the default checks every step); `replicated`:
    keyword arguments of `towers.Replicated` (its all-reduce and buckets).
    """
    if strategy == "replicated":
        model = towers.Replicated(make_model, devices, **(replicated or {}))
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
    rows[f"towers replicated{xla}, no guard"] = functools.partial(
        towers_step, devices=devices, dataset=dataset, nonfinite=None
    )
    if jit_compile:
        rows["towers replicated xla, skip"] = functools.partial(
            towers_step, devices=devices, dataset=dataset, nonfinite="skip"
        )
        rows["towers replicated xla, update uncompiled"] = functools.partial(
            towers_stages, devices=devices, dataset=dataset
        )
        rows["hand-written towers xla, update compiled"] = functools.partial(
            replicated, devices=devices, dataset=dataset, compile_update=True
        )
        if len(devices) > 1:  # the embedding's gradient both ways ("auto" takes one of them)
            for sparse in ("dense", "gather"):
                rows[f"towers replicated xla, sparse {sparse}"] = functools.partial(
                    towers_step, devices=devices, dataset=dataset, replicated=dict(sparse=sparse)
                )
        if len(devices) > 1:  # each copy updates its share and gathers the others' weights
            rows["towers replicated xla, sharded state"] = functools.partial(
                towers_step,
                devices=devices,
                dataset=dataset,
                replicated=dict(shard_optimizer_state=True),
            )
        if len(devices) > 1:  # the exchange in fewer, larger transfers (the default in one)
            rows["towers replicated xla, one bucket"] = functools.partial(
                towers_step, devices=devices, dataset=dataset, replicated=dict(bucket_bytes=2**40)
            )
            for name, algorithm, size, bucket in (
                ("ring", "ring", "64 MiB buckets", 64 * 2**20),
                ("reduce-broadcast", "reduce_broadcast", "64 MiB buckets", 64 * 2**20),
                ("reduce-broadcast", "reduce_broadcast", "one bucket", 2**40),
            ):
                rows[f"towers replicated xla, {name}, {size}"] = functools.partial(
                    towers_step,
                    devices=devices,
                    dataset=dataset,
                    replicated=dict(all_reduce=algorithm, bucket_bytes=bucket),
                )
        if strategy is not None and strategy.num_replicas_in_sync == 1:
            rows["mirrored xla, whole replica"] = functools.partial(
                mirrored, strategy=strategy, dataset=dataset, whole=True
            )
    return {label: functools.partial(build, make_model, **common) for label, build in rows.items()}
