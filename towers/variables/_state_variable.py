"""Variables of towers' own state, made as if eagerly: a step's first call is traced once."""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.ops.internal import device_scope


def state_variable(
    initial_value: Callable[[], Any] | Any,
    device: str | None = None,
    *,
    hidden: bool = True,
    **kwargs: Any,
) -> tf.Variable:
    """A variable of towers' own state: an optimizer slot or count, a sum, a loss scale.

    Made in `tf.init_scope()` (eagerly, or in the outermost v1 graph) on `device`, and, if
    `hidden`, hidden from the `tf.function` being traced: a function whose first call makes
    variables it knows of is traced twice (once making them, once more without), and each
    compiled program in it is compiled twice. State made by a step's first call (an
    optimizer's slots, an accumulator's sums) so costs no second trace. A later trace may
    make hidden state for variables it meets first, unless the function's first call made
    variables it knows of (a model built lazily): then TensorFlow refuses any variable in
    later traces. Never returned from the function (TensorFlow's rule for them).

    The owner of the state passes `hidden=False` when it was itself made inside a
    `tf.function`: each trace would make a new owner with new state, and the state of the
    trace before would be lost without a word. Known to the function, such state keeps
    TensorFlow's rule: a trace after the first fails ("singleton tf.Variables").

    Args:
      initial_value: The value, or a callable making it (made inside the scope: within a
        `tf.function`'s trace a tensor built outside could not initialize it).
      device: Where the variable lives; None keeps the caller's scope.
      hidden: Hide the variable from the `tf.function` being traced.
      **kwargs: Passed to `tf.Variable` (`trainable`, `name`, ...).

    Returns:
      The variable, initialized.
    """
    with tf.init_scope(), device_scope(device):
        return tf.Variable(initial_value, experimental_enable_variable_lifting=not hidden, **kwargs)
