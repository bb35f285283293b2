"""What every configuration of the models suite trains by: one loss's gradients, plain SGD."""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

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
