"""One copy's updates on one device: chosen by the non-finite verdict, compiled or not.

`Optimizer.apply_gradients` groups a copy's variables by device and builds each group here:
the rule's in-place updates, each written variable (slots included) then kept or written
back as it was by the verdict (`towers.ops.internal.selected`), and with `jit_compile` all
of it as one XLA program on the device, which reads only that device's variables (the rate
and the step count come in as arguments).
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.ops.internal import densified, device_scope, selected, update_ops


def copy_updates(
    optimizer: Any, copy: int, group: list, finite: tf.Tensor | None, jit_compile: bool
) -> list:
    """One copy's updates, device by device, and its step count (advanced where finite).

    Args:
      optimizer: The towers `Optimizer`.
      copy: Which copy of the variables.
      group: `(grad, var, state)` of each of its variables to update.
      finite: The verdict, or None.
      jit_compile: One XLA program per device.
    """
    counter = optimizer.iterations.get(copy)
    with device_scope(counter.device if counter is not None else None):
        with tf.name_scope(optimizer.name):
            done = counter.read_value() if counter is not None else tf.constant(0, tf.int64)
            lr = None
            if not isinstance(optimizer.learning_rate, (int, float)):
                lr = tf.cast(optimizer.current_learning_rate(done), tf.float32)
    updates = []
    for device, items in by_device(group).items():
        with tf.device(device), tf.name_scope(optimizer.name):
            grads = [grad for grad, _, _ in items]
            if jit_compile:
                grads = [_static(grad, var) for grad, (_, var, _) in zip(grads, items)]
                updates.append(compiled_update(optimizer, items)(grads, lr, done, finite))
            else:
                updates += device_update(optimizer, items, grads, lr, done, finite)
    if counter is None:
        return updates
    with tf.device(counter.device), tf.control_dependencies(update_ops(updates)):
        one = tf.constant(1, tf.int64) if finite is None else tf.cast(finite, tf.int64)
        return [*updates, counter.assign_add(one)]


def by_device(group: list) -> dict[str, list]:
    """`(grad, var, state)` items by their variable's device, in order."""
    found: dict[str, list] = {}
    for item in group:
        found.setdefault(item[1].device, []).append(item)
    return found


def _static(grad: Any, var: tf.Variable) -> Any:
    """`grad` as an XLA program's argument: its shape the same at every step.

    Rows of `tf.IndexedSlices` whose number changes from step to step (each row once, after
    the duplicates are summed: as many as the batch's distinct ids) would make XLA compile
    the program again for each new number; they are made dense here, on the device (the
    program would make them dense anyway).
    """
    if isinstance(grad, tf.IndexedSlices) and not grad.values.shape.is_fully_defined():
        return densified(grad, var)
    return grad


def compiled_update(optimizer: Any, items: list) -> Callable[..., Any]:
    """`device_update` of `items` as one XLA program (traced when first called)."""

    def update(grads: list, lr: Any, done: tf.Tensor, finite: Any) -> tf.Tensor:
        built = device_update(optimizer, items, grads, lr, done, finite, compiled=True)
        with tf.control_dependencies(built):  # the program's output; its writes are its effect
            return tf.constant(True)

    return tf.function(update, jit_compile=True, autograph=False)


def device_update(
    optimizer: Any,
    items: list,
    grads: list,
    lr: tf.Tensor | None,
    done: tf.Tensor,
    finite: tf.Tensor | None,
    compiled: bool = False,
) -> list:
    """The updates of `items` (one device's), kept only where `finite`: a list of ops.

    Args:
      optimizer: The towers `Optimizer`.
      items: `(grad, var, state)` of each variable (the gradient as given).
      grads: The gradients to apply, aligned with `items`.
      lr: The learning rate (float32), or None for the optimizer's number.
      done: The copy's step count before this update.
      finite: The verdict, or None to keep every write.
      compiled: Inside an XLA program: sparse gradients are made dense (XLA has no unique).
    """
    # A plain number becomes each variable's dtype directly: through float32, a float64
    # model's rate would be off by up to 3e-8 relative.
    number = lr is None and optimizer.learning_rate
    cast: dict = {}

    def build() -> list:
        updates = []
        for grad, (_, var, state) in zip(grads, items):
            if var.dtype not in cast:
                rate = tf.constant(number, var.dtype) if lr is None else lr
                cast[var.dtype] = (tf.cast(rate, var.dtype), tf.cast(done + 1, var.dtype))
            if compiled and isinstance(grad, tf.IndexedSlices):
                grad = densified(grad, var)
            updates.append(optimizer._update_one(grad, var, state.slots, *cast[var.dtype]))
        return updates

    written = [v for _, var, state in items for v in (var, *state.slots.values())]
    return selected(finite, written, build)
