"""Weighted means over towers: shard sizes as weights, sums accumulated in float32 for halves.

Gradient averaging, gradient all-reduce and output merging all weight tower i by
`size_i / batch`; this module holds that arithmetic once.
"""

import math
from collections.abc import Sequence

import numpy as np

from towers.ops._tensorflow import tf

Weight = int | float | tf.Tensor


def normalized_weights(
    weights: Sequence[Weight] | None, num: int, what: str, total: Weight | None = None
) -> list[Weight]:
    """Returns `num` weights that sum to one (or, with `total`, their share of `total`).

    Args:
      weights: None for equal weights, or `num` non-negative finite numbers (numpy's
        included) or scalar tensors (shard sizes can be passed as they are); they are
        divided by their sum.
      num: How many values are being weighted (towers).
      what: The calling function's name, for error messages.
      total: What to divide by instead of the weights' own sum: the sum of every weight of
        a reduction that spans more values than these (several workers' towers).

    Returns:
      A list of `num` Python floats when every weight is a Python number, else float64
      scalars (cast to each value's dtype where they are used).

    Raises:
      ValueError: if the count is wrong, a number is negative or not finite, or all are zero.
      TypeError: if a weight is neither a number nor a tensor.
    """
    if weights is None:
        return [1.0 / num] * num
    weights = checked_weights(weights)
    if len(weights) != num:
        raise ValueError(
            f"`weights` must have one entry per tower for {what}; got {len(weights)} weights "
            f"for {num} towers. Pass the shard sizes from `ops.shard_sizes`."
        )
    if total is None and all(isinstance(w, (int, float)) for w in weights):
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"`weights` must be non-negative with a positive sum; got {weights}.")
        total = float(sum(weights))
        return [w / total for w in weights]
    weights = [weight_in(w, tf.float64) for w in weights]  # cast to each value's dtype later
    total = tf.add_n(weights) if total is None else weight_in(total, tf.float64)
    return [w / total for w in weights]


def checked_weights(weights: Sequence[object]) -> list[Weight]:
    """The weights, each a Python number (from a Python or numpy one, finite) or a tensor.

    Raises:
      ValueError: for a number that is not finite.
      TypeError: for a weight that is neither a number nor a tensor.
    """
    return [_number_or_tensor(w) for w in weights]


def _number_or_tensor(weight: object) -> Weight:
    """A Python number for a Python or numpy number (checked finite), else the tensor."""
    if isinstance(weight, np.ndarray) and weight.ndim == 0:
        weight = weight[()]
    if isinstance(weight, (np.integer, np.floating, np.bool_)):
        weight = weight.item()
    if isinstance(weight, bool) or not isinstance(weight, (int, float, tf.Tensor, tf.Variable)):
        raise TypeError(f"A weight must be a number or a scalar tensor; got {weight!r}.")
    if isinstance(weight, float) and not math.isfinite(weight):
        raise ValueError(f"`weights` must be finite; got {weight}.")
    return weight


def weight_in(weight: Weight, dtype: tf.DType) -> tf.Tensor:
    """A weight as a `dtype` scalar: a Python number exactly, a tensor cast.

    `tf.cast(0.3, tf.float64)` makes a float32 constant first: 0.30000001192, 4e-8 off.
    """
    if isinstance(weight, (int, float)):
        return tf.constant(weight, dtype)
    return tf.cast(weight, dtype)


def equal_weights(weights: Sequence[Weight]) -> bool:
    """Whether the weights are Python numbers that all agree (one multiply suffices)."""
    return all(isinstance(w, float) for w in weights) and len(set(weights)) == 1


def accumulation_dtype(dtype: tf.DType) -> tf.DType:
    """float32 for float16 and bfloat16 (sums of halves lose too much), else `dtype`."""
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def weighted_sum(
    values: Sequence[tf.Tensor], weights: Sequence[Weight], *, wide: bool = False
) -> tf.Tensor:
    """`sum(w * v)`, accumulated in float32 for half precision; one multiply if weights agree.

    In the values' dtype, or with `wide` in the one it was accumulated in.
    """
    dtype = values[0].dtype
    sum_dtype = accumulation_dtype(dtype)
    if equal_weights(weights):
        total = tf.add_n([tf.cast(v, sum_dtype) for v in values])
        total = total * weight_in(weights[0], sum_dtype)
    else:
        total = tf.add_n(
            [tf.cast(v, sum_dtype) * weight_in(w, sum_dtype) for v, w in zip(values, weights)]
        )
    return total if wide else tf.cast(total, dtype)


def scale(values: tf.Tensor, weight: Weight) -> tf.Tensor:
    """`values * weight`, computed in float32 for half-precision values."""
    wide = accumulation_dtype(values.dtype)
    return tf.cast(tf.cast(values, wide) * weight_in(weight, wide), values.dtype)
