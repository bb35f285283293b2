"""Averaging `K x N` tower gradients into N gradients, sparse and half precision included."""

from collections.abc import Sequence

from ops._placement import device_scope
from ops._tensorflow import tf
from ops._weights import Weight, normalized_weights

Gradient = tf.Tensor | tf.IndexedSlices | None


@tf.autograph.experimental.do_not_convert
def average_gradients(
    tower_grads: Sequence[Sequence[Gradient]],
    weights: Sequence[Weight] | None = None,
    *,
    variables: Sequence[tf.Variable] | None = None,
) -> list[Gradient]:
    """Averages the gradients of K towers, variable by variable.

    With `weights` set to the shard sizes, the average of per-shard mean-loss gradients equals
    the gradient of the mean loss over the whole batch, also for uneven splits.

    * A variable whose gradient is None in every tower stays None.
    * `tf.IndexedSlices` stay sparse: indices and scaled values are concatenated.
    * A mix of sparse and dense gradients becomes dense.
    * float16 and bfloat16 gradients are accumulated in float32 and cast back.

    Args:
      tower_grads: K lists (one per tower) of N gradients, aligned with one list of variables.
      weights: K non-negative weights, normalized to sum to one; None for the plain mean.
      variables: The N variables, optional. When given, each average is built on its
        variable's device (reduce where the variable lives) and errors name the variable.

    Returns:
      A list of N averaged gradients.

    Raises:
      ValueError: if the towers disagree on N, or a gradient is None in some towers only.
      TypeError: if a gradient is neither a tensor, `tf.IndexedSlices` nor None.

    Example:
      >>> grads = ops.average_gradients(tower_grads, weights=ops.shard_sizes(batch, k))
      >>> optimizer.apply_gradients(zip(grads, variables))
    """
    tower_grads = check_tower_grads(tower_grads, variables)
    norm = (
        None
        if len(tower_grads) == 1 and weights is None
        else normalized_weights(weights, len(tower_grads), "average_gradients")
    )
    averaged = []
    for j, column in enumerate(zip(*tower_grads)):
        name = variables[j].name if variables is not None else f"#{j}"
        with device_scope(variables[j].device if variables is not None else None):
            averaged.append(_average_one(list(column), norm, name))
    return averaged


def _average_one(grads: list[Gradient], weights: list | None, name: str) -> Gradient:
    """Averages one variable's gradients over the towers."""
    if not check_column(grads, name):
        return None
    if weights is None:
        return grads[0]
    if all(isinstance(g, tf.IndexedSlices) for g in grads):
        return tf.IndexedSlices(
            values=tf.concat([scale(g.values, w) for g, w in zip(grads, weights)], axis=0),
            indices=tf.concat([g.indices for g in grads], axis=0),
            dense_shape=grads[0].dense_shape,
        )
    dense = next(g for g in grads if not isinstance(g, tf.IndexedSlices))
    grads = [densify(g, dense) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return weighted_sum(grads, weights)


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


def check_column(grads: Sequence[Gradient], name: str) -> bool:
    """Whether one variable's K gradients exist: False if all are None, else checks them.

    Raises:
      ValueError: if some towers have None and others not.
      TypeError: if a gradient is neither a tensor, `tf.IndexedSlices` nor None.
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
    return True


def weighted_sum(values: Sequence[tf.Tensor], weights: Sequence[Weight]) -> tf.Tensor:
    """`sum(w * v)`, accumulated in float32 for half precision; one multiply if weights agree."""
    dtype = values[0].dtype
    wide = accumulation_dtype(dtype)
    if all(isinstance(w, float) for w in weights) and len(set(weights)) == 1:
        total = tf.add_n([tf.cast(v, wide) for v in values]) * tf.cast(weights[0], wide)
    else:
        total = tf.add_n([tf.cast(v, wide) * tf.cast(w, wide) for v, w in zip(values, weights)])
    return tf.cast(total, dtype)


def accumulation_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def scale(values: tf.Tensor, weight: Weight) -> tf.Tensor:
    """`values * weight`, computed in float32 for half-precision values."""
    wide = accumulation_dtype(values.dtype)
    return tf.cast(tf.cast(values, wide) * tf.cast(weight, wide), values.dtype)


def densify(grad: tf.IndexedSlices, like: tf.Tensor) -> tf.Tensor:
    """The dense tensor of `grad`, shaped like the dense gradient `like`."""
    num_rows = tf.shape(like, out_type=grad.indices.dtype)[0]
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, num_rows)
    dense.set_shape(like.shape)
    return dense
