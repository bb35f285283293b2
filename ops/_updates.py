"""The ops of update results, for control dependencies that must wait for them."""

from typing import Any

from towers.ops._tensorflow import tf


def update_ops(updates: Any) -> list:
    """The ops and tensors in update results (nested), for a control dependency.

    A variable's `assign` in a graph returns the variable, unread: its `op` is the update.
    Anything else (None, numbers, eagerly run updates) is left out.
    """
    found = []
    for value in tf.nest.flatten(updates):
        if isinstance(value, (tf.Operation, tf.Tensor)):
            found.append(value)
        elif isinstance(getattr(value, "op", None), tf.Operation):
            found.append(value.op)
    return found
