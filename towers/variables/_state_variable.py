"""Variables of towers' own state, made as if eagerly: a step's first call is traced once."""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.ops.internal import device_scope


def state_variable(
    initial_value: Callable[[], Any] | Any, device: str | None = None, **kwargs: Any
) -> tf.Variable:
    """A variable of towers' own state: an optimizer slot or count, a sum, a loss scale.

    Made in `tf.init_scope()` (eagerly, or in the outermost v1 graph) on `device`, and hidden
    from the `tf.function` being traced: a function whose first call makes variables it
    knows of is traced twice (once making them, once more without), and each compiled
    program in it is compiled twice. State made by a step's first call (an optimizer's
    slots, an accumulator's sums) so costs no second trace, and a later trace may make
    state for variables it meets first (it would fail: "tried to create variables on
    non-first call"). Never returned from the function (TensorFlow's rule for them).

    Args:
      initial_value: The value, or a callable making it (made inside the scope: within a
        `tf.function`'s trace a tensor built outside could not initialize it).
      device: Where the variable lives; None keeps the caller's scope.
      **kwargs: Passed to `tf.Variable` (`trainable`, `name`, ...).

    Returns:
      The variable, initialized.
    """
    with tf.init_scope(), device_scope(device):
        return tf.Variable(initial_value, experimental_enable_variable_lifting=False, **kwargs)
