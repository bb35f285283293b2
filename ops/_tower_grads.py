"""The `K x N` tower-gradient structure: entries, checks, columns and `(gradient, variable)` pairs.

Tower gradients are a list over K towers of lists over N variables, aligned with one variable
list; each entry is a `tf.Tensor`, a `tf.IndexedSlices` or None.
"""

from collections.abc import Sequence
from typing import Any

from towers.ops._autograph import library_code
from towers.ops._slices import densified
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import accumulation_dtype

Gradient = tf.Tensor | tf.IndexedSlices | None


@library_code
def split_grad_list(
    tower_grads_and_vars: Sequence[Sequence[tuple[Gradient, tf.Variable]]],
) -> tuple[list[list[Gradient]], list[list[tf.Variable]]]:
    """Splits K lists of `(gradient, variable)` pairs into `K x N` gradients and variables.

    Args:
      tower_grads_and_vars: One list of N `(gradient, variable)` pairs per tower, as returned
        by `optimizer.compute_gradients`-style code.

    Returns:
      `(grads, variables)`, both K lists of N entries; the inverse of `merge_grad_list`.

    Raises:
      ValueError: if a tower's list has a different length or holds something else than pairs.
    """
    grads, variables = [], []
    for i, pairs in enumerate(tower_grads_and_vars):
        pairs = list(pairs)
        if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in pairs):
            raise ValueError(f"Tower {i} must hold (gradient, variable) pairs; got {pairs!r}.")
        if grads and len(pairs) != len(grads[0]):
            raise ValueError(
                f"Every tower must have one pair per variable; tower 0 has {len(grads[0])} and "
                f"tower {i} has {len(pairs)}."
            )
        grads.append([g for g, _ in pairs])
        variables.append([v for _, v in pairs])
    return grads, variables


@library_code
def merge_grad_list(
    grads: Sequence[Sequence[Gradient]], variables: Sequence[Sequence[tf.Variable]]
) -> list[list[tuple[Gradient, tf.Variable]]]:
    """Zips `K x N` gradients and variables into K lists of `(gradient, variable)` pairs.

    Args:
      grads: K lists of N gradients.
      variables: K lists of N variables (the same list K times for shared variables).

    Returns:
      K lists of N pairs; the inverse of `split_grad_list`.

    Raises:
      ValueError: if the two disagree on K or on N for some tower.
    """
    if len(grads) != len(variables):
        raise ValueError(
            f"`grads` and `variables` must have one list per tower; got {len(grads)} and "
            f"{len(variables)}."
        )
    merged = []
    for i, (tower_g, tower_v) in enumerate(zip(grads, variables)):
        if len(tower_g) != len(tower_v):
            raise ValueError(
                f"Tower {i} has {len(tower_g)} gradients for {len(tower_v)} variables."
            )
        merged.append(list(zip(tower_g, tower_v)))
    return merged


def check_tower_grads(
    tower_grads: Sequence[Sequence[Gradient]], variables: Sequence[tf.Variable] | None
) -> list[list[Gradient]]:
    """`tower_grads` as K lists of N, checked to be rectangular and to match `variables`."""
    tower_grads = [list(grads) for grads in tower_grads]
    if not tower_grads:
        raise ValueError("`tower_grads` must hold at least one tower's gradients; got [].")
    num_vars = len(tower_grads[0])
    for i, grads in enumerate(tower_grads):
        if len(grads) != num_vars:
            raise ValueError(
                f"Every tower must have one gradient per variable; tower 0 has {num_vars} and "
                f"tower {i} has {len(grads)}."
            )
    if variables is not None and len(variables) != num_vars:
        raise ValueError(
            f"`variables` must match the {num_vars} gradients per tower; got {len(variables)}."
        )
    return tower_grads


def check_column(grads: Sequence[Gradient], name: str, variable: tf.Variable | None = None) -> bool:
    """Whether one variable's K gradients exist: False if all are None, else checks them.

    Every tower's gradient must have the variable's dtype and shape (the rows of
    `tf.IndexedSlices` its trailing shape): towers that disagree would be cast or reshaped
    into one another silently.

    Raises:
      ValueError: if some towers have None and others not, or towers (or the variable)
        disagree on shape or dtype.
      TypeError: if a gradient is neither a tensor, `tf.IndexedSlices` nor None, or is not
        floating-point (a mean of integers is not exact).
    """
    missing = [i for i, g in enumerate(grads) if g is None]
    if len(missing) == len(grads):
        return False
    if missing:
        raise ValueError(
            f"The gradient of variable {name} is None in towers {missing} but not in the others. "
            "Every tower must use the same variables; check for towers that skip a layer."
        )
    for i, g in enumerate(grads):
        if not isinstance(g, (tf.Tensor, tf.IndexedSlices)):
            raise TypeError(
                f"Gradients must be tf.Tensor, tf.IndexedSlices or None; variable {name} has "
                f"{type(g).__name__} in tower {i}."
            )
    dtypes = [(g.values if isinstance(g, tf.IndexedSlices) else g).dtype for g in grads]
    if not (dtypes[0].is_floating or dtypes[0].is_complex):
        raise TypeError(
            f"The gradient of variable {name} is {dtypes[0].name}: gradients are averaged, and "
            "a mean of integers is not exact. Cast it to a float (or keep it out of the step)."
        )
    shapes = [_dense_shape(g) for g in grads]
    expected = (
        (dtypes[0], shapes[0], "tower 0")
        if variable is None
        else (variable.dtype.base_dtype, variable.shape, "the variable")
    )
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        if dtype != expected[0] or not shape.is_compatible_with(expected[1]):
            raise ValueError(
                f"The gradients of variable {name} must agree in dtype and shape; "
                f"{expected[2]} has {expected[0].name}{expected[1]} and tower {i} "
                f"{dtype.name}{shape}."
            )
    return True


def _dense_shape(grad: tf.Tensor | tf.IndexedSlices) -> tf.TensorShape:
    """The shape of the dense gradient: slices' rows, with an unknown first dimension."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.TensorShape([None]).concatenate(grad.values.shape[1:])
    return grad.shape


def column_dtype(tower_grads: list, j: int) -> tf.DType:
    """The dtype of variable j's gradients (of tower 0's, which the others agree with)."""
    grad = tower_grads[0][j]
    return grad.values.dtype if isinstance(grad, tf.IndexedSlices) else grad.dtype


def dense_column(
    column: list, devices: list, variable: Any = None, wide: bool = True
) -> list[tf.Tensor]:
    """Each tower's gradient, dense and (`wide`) in float32 if half, on its device.

    Slices take the shape of a dense gradient of the column, else of `variable`, else their
    `dense_shape` where it is known while the graph is built (packing needs static shapes).
    """
    like = next((g for g in column if not isinstance(g, tf.IndexedSlices)), variable)
    dense = []
    for grad, device in zip(column, devices):
        with tf.device(device):
            if isinstance(grad, tf.IndexedSlices) and like is not None:
                grad = densified(grad, like)
            elif isinstance(grad, tf.IndexedSlices):
                shape = tf.get_static_value(grad.dense_shape)
                grad = tf.convert_to_tensor(grad)
                if shape is not None:
                    grad.set_shape(shape)
            dense.append(tf.cast(grad, accumulation_dtype(grad.dtype)) if wide else grad)
    return dense
