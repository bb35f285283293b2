"""What a gradient hook returns, checked: shapes and dtypes now, new sparse rows at run time."""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import deduplicated, host_scope, library_code


def unique_rows(grad: Any) -> Any:
    """`tf.IndexedSlices` with each row once (repeated rows summed); anything else as it is.

    What the gradient hook sees: `tf.linalg.global_norm` and `tf.clip_by_global_norm` of
    slices with repeated rows would measure the rows, not the gradient.
    """
    return deduplicated(grad) if isinstance(grad, tf.IndexedSlices) else grad


@library_code
def checked(grads: Sequence, given: Sequence, variables: list[tf.Variable]) -> list:
    """Checks the hook's gradients against the variables; returns the run-time checks.

    Shapes and dtypes are checked now, while the graph is built. Rows of `tf.IndexedSlices`
    the hook made (not those it was given) are checked when the step runs: every update
    waits for these checks, so a bad row changes no variable.
    """
    if not isinstance(grads, (list, tuple)) or len(grads) != len(variables):
        raise ValueError(
            f"`gradient_hook` must return a list of {len(variables)} gradients, one per "
            f"variable; got {grads!r}."
        )
    checks = []
    for grad, original, var in zip(grads, given, variables):
        if grad is None:
            continue
        if not isinstance(grad, (tf.Tensor, tf.IndexedSlices)):
            raise TypeError(
                f"`gradient_hook` returned a {type(grad).__name__} for variable {var.name}; "
                "return tf.Tensor, tf.IndexedSlices or None."
            )
        _check_shape(grad, var)
        if isinstance(grad, tf.IndexedSlices) and grad is not original:
            checks += _checked_rows(grad, var)
    return checks


def _check_shape(grad: tf.Tensor | tf.IndexedSlices, var: tf.Variable) -> None:
    sparse = isinstance(grad, tf.IndexedSlices)
    values = grad.values if sparse else grad
    shape, got = (var.shape[1:], values.shape[1:]) if sparse else (var.shape, values.shape)
    if values.dtype != var.dtype or not got.is_compatible_with(shape):
        raise ValueError(
            f"`gradient_hook` returned a {values.dtype.name}{values.shape} gradient for "
            f"variable {var.name} of {var.dtype.name}{var.shape}; return one of the "
            "variable's shape and dtype (cast with tf.cast), or None to skip it."
        )
    if sparse:
        indices = grad.indices
        rows_agree = indices.shape[:1].is_compatible_with(values.shape[:1])
        if indices.dtype not in (tf.int32, tf.int64) or indices.shape.rank != 1 or not rows_agree:
            raise ValueError(
                f"`gradient_hook` returned tf.IndexedSlices for variable {var.name} whose "
                f"indices are {indices.dtype.name}{indices.shape} for values of shape "
                f"{values.shape}; indices must be one int32 or int64 row index per value row."
            )


def _checked_rows(grad: tf.IndexedSlices, var: tf.Variable) -> list:
    rows = tf.cast(tf.shape(var)[0], grad.indices.dtype)
    message = f"`gradient_hook` returned row indices outside [0, rows) for variable {var.name}"
    with host_scope():  # (the checks' messages: strings)
        checks = [
            tf.debugging.assert_non_negative(grad.indices, message=message),
            tf.debugging.assert_less(grad.indices, rows, message=message),
        ]
    return [c for c in checks if c is not None]  # eagerly they ran (and passed) already
