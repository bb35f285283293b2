"""Normalized per-tower weights, shared by gradient averaging and output merging."""

from collections.abc import Sequence

from ops._tensorflow import tf

Weight = int | float | tf.Tensor


def normalized_weights(weights: Sequence[Weight] | None, num: int, what: str) -> list[Weight]:
    """Returns `num` weights that sum to one.

    Args:
      weights: None for equal weights, or `num` non-negative numbers or scalar tensors (shard
        sizes can be passed as they are); they are divided by their sum.
      num: How many values are being weighted (towers).
      what: The calling argument's description, for error messages.

    Returns:
      A list of `num` Python floats when every weight is a Python number, else float32 scalars.

    Raises:
      ValueError: if the count is wrong, a weight is negative, or all are zero.
    """
    if weights is None:
        return [1.0 / num] * num
    weights = list(weights)
    if len(weights) != num:
        raise ValueError(
            f"`weights` must have one entry per tower for {what}; got {len(weights)} weights "
            f"for {num} towers. Pass the shard sizes from `ops.shard_sizes`."
        )
    if all(isinstance(w, (int, float)) for w in weights):
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"`weights` must be non-negative with a positive sum; got {weights}.")
        total = float(sum(weights))
        return [w / total for w in weights]
    weights = [tf.cast(w, tf.float32) for w in weights]
    total = tf.add_n(weights)
    return [w / total for w in weights]
