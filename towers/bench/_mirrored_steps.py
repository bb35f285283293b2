"""The models suite's MirroredStrategy configurations: the peer in a custom loop."""

import functools
from typing import Any

import tensorflow as tf

from towers.bench._model_rule import LossFn, ModelFactory, loss_and_gradients, sgd
from towers.bench._steps import Step


def mirrored(
    make_model: ModelFactory,
    loss_fn: LossFn,
    strategy: tf.distribute.Strategy,
    *,
    jit_compile: bool = False,
    dataset: tf.data.Dataset | None = None,
    whole: bool = False,
) -> Step:
    """`tf.distribute.MirroredStrategy` in a custom loop, as its guide writes one.

    Each replica computes its loss and gradients (with `jit_compile`, in a
    `tf.function(jit_compile=True)` called inside `strategy.run`), all-reduces them in one
    `ctx.all_reduce("mean", grads)` (a single batched reduction of the whole list) and applies
    them in `merge_call` with `strategy.extended.update`. Fed by
    `strategy.experimental_distribute_dataset` when a dataset is given, else by splitting
    the batch with `experimental_distribute_values_from_function`. `whole` (one replica):
    the replica's whole step in one XLA program, update included, as Keras's
    `jit_compile=True` runs under a strategy.
    """
    with strategy.scope():
        model = make_model()
    variables = [var.value for var in model.trainable_variables]  # the MirroredVariables
    tower = functools.partial(loss_and_gradients, model, loss_fn)
    if jit_compile:
        tower = tf.function(tower, jit_compile=True)
    if whole:
        return _mirrored_whole(model, loss_fn, strategy, dataset)

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


def _mirrored_whole(
    model: Any, loss_fn: LossFn, strategy: tf.distribute.Strategy, dataset: Any
) -> Step:
    """One replica's loss, gradients and update as one XLA program, run by `strategy.run`."""
    if strategy.num_replicas_in_sync != 1:
        raise ValueError("A whole compiled replica step is for one replica (no all-reduce).")

    @tf.function(jit_compile=True)
    def whole(shard):
        loss, grads = loss_and_gradients(model, loss_fn, shard)
        with tf.control_dependencies(sgd(model.trainable_variables, grads)):
            return tf.identity(loss)

    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def step(batch):
        del batch  # the dataset's instead
        return strategy.reduce("mean", strategy.run(whole, args=(next(iterator),)), axis=None)

    return step
