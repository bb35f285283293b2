"""Averaging `K x N` tower gradients into N gradients, sparse and half precision included."""

from collections.abc import Sequence

from towers.ops._autograph import library_code
from towers.ops._device_scope import device_scope
from towers.ops._packed_average import packed_mean
from towers.ops._packing import check_bucket_bytes
from towers.ops._slices import densified
from towers.ops._tensorflow import tf
from towers.ops._tower_grads import Gradient, check_column, check_tower_grads
from towers.ops._weighted_mean import Weight, normalized_weights, scale, weighted_sum


@library_code
def average_gradients(
    tower_grads: Sequence[Sequence[Gradient]],
    weights: Sequence[Weight] | None = None,
    *,
    variables: Sequence[tf.Variable] | None = None,
    bucket_bytes: int | None = None,
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
      bucket_bytes: With `variables`, each tower packs its dense gradients of the variables
        of one device into buckets of at most this many bytes, which cross to that device
        instead of N tensors (the same values; from two towers, float32 gradients that
        are casts of half-precision ones are packed in that dtype and widened there); None
        to send each gradient alone. Needs static shapes.

    Returns:
      A list of N averaged gradients.

    Raises:
      ValueError: if the towers disagree on N, a gradient is None in some towers only, or
        towers (or a variable given) disagree on a gradient's shape or dtype.
      TypeError: if a gradient is neither a tensor, `tf.IndexedSlices` nor None, or is not
        floating-point.

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
    check_bucket_bytes(bucket_bytes)
    packed: dict[str, list[int]] = {}  # variable device -> the dense columns packed for it
    averaged = []
    for j, column in enumerate(zip(*tower_grads)):
        name = variables[j].name if variables is not None else f"#{j}"
        variable = variables[j] if variables is not None else None
        if not check_column(column, name, variable):
            averaged.append(None)
            continue
        if _packable(column, norm, variables, bucket_bytes):
            packed.setdefault(variables[j].device, []).append(j)
            averaged.append(None)
            continue
        with device_scope(variables[j].device if variables is not None else None):
            averaged.append(_average_one(list(column), norm))
    for device, columns in packed.items():
        per_tower = [[grads[j] for j in columns] for grads in tower_grads]
        for j, mean in zip(columns, packed_mean(per_tower, norm, device, bucket_bytes)):
            averaged[j] = mean
    return averaged


def _packable(column, weights, variables, bucket_bytes) -> bool:
    """Whether a column goes into the packed buffers: dense, static, with a known device."""
    return (
        bucket_bytes is not None
        and variables is not None
        and weights is not None
        and len(column) > 1
        and all(isinstance(g, tf.Tensor) and g.shape.is_fully_defined() for g in column)
    )


def _average_one(grads: list[Gradient], weights: list | None) -> Gradient:
    """Averages one variable's (checked, existing) gradients over the towers."""
    if weights is None:
        return grads[0]
    if all(isinstance(g, tf.IndexedSlices) for g in grads):
        return tf.IndexedSlices(
            values=tf.concat([scale(g.values, w) for g, w in zip(grads, weights)], axis=0),
            indices=tf.concat([g.indices for g in grads], axis=0),
            dense_shape=grads[0].dense_shape,
        )
    dense = next(g for g in grads if not isinstance(g, tf.IndexedSlices))
    grads = [densified(g, dense) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return weighted_sum(grads, weights)
