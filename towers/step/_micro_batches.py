"""Running one tower's shard as several micro-batches in sequence, gradients accumulated."""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

import towers.ops as ops
from towers.core import examples_from
from towers.ops.internal import accumulation_dtype, check_int, normalized_weights, weight_in


def _weights(sizes: list) -> list:
    """The parts' weights of the mean: their sizes, normalized."""
    return normalized_weights(sizes, len(sizes), "micro_batches")


def check_micro_batches(micro_batches: Any) -> int:
    """`micro_batches` as an int >= 1, or a clear error.

    Raises:
      TypeError: if it is not an int.
      ValueError: if it is < 1.
    """
    return check_int(micro_batches, "micro_batches", minimum=1)


def in_micro_batches(
    one_pass: Callable[[Any], tuple[tf.Tensor, Any, list]],
    shard: Any,
    micro_batches: int,
    merge: Any,
) -> tuple[tf.Tensor, Any, list]:
    """`one_pass` on each of `micro_batches` parts of `shard`, one after the other.

    The parts' sizes differ by at most one; each part starts only once the gradients of the
    one before are computed, so the activations of one part at a time are alive. Gradients
    and losses are averaged weighted by part size (exact for uneven parts); outputs merged
    with `merge`.

    Args:
      one_pass: Returns `(loss, outputs, grads)` for a part.
      shard: The tower's inputs.
      micro_batches: The number of parts.
      merge: How to merge the parts' outputs (`ops.merge_outputs`'s mode).

    Returns:
      `(loss, outputs, grads)` of the whole shard.

    Raises:
      ValueError: if the shard has fewer examples than `micro_batches`.
    """
    try:
        parts = ops.split_batch(shard, micro_batches, device=None)
        sizes = ops.shard_sizes(shard, micro_batches)
    except ValueError as error:
        raise ValueError(
            f"A tower's shard must hold at least micro_batches={micro_batches} examples: {error}"
        ) from None
    weights = _weights(sizes)
    losses, outputs, total, before = [], [], None, []
    for k, (part, weight) in enumerate(zip(parts, weights)):
        if before:
            with tf.control_dependencies(before):
                part = tf.nest.map_structure(tf.identity, part)
        with examples_from(sizes[:k]):  # where the part's examples sit in the batch
            loss, out, grads = one_pass(part)
        losses.append(loss)
        outputs.append(out)
        total = _added(total, grads, weight)  # a running sum: one part's gradients alive
        before = [
            g.values if isinstance(g, tf.IndexedSlices) else g for g in total if g is not None
        ]
    loss = ops.merge_outputs(losses, "mean", weights=sizes)
    merged = None if outputs[0] is None else ops.merge_outputs(outputs, merge, weights=sizes)
    return loss, merged, [_cast_back(t, g) for t, g in zip(total, grads)]


def _added(total: list | None, grads: list, weight: Any) -> list:
    """`total + weight * grads` per variable; sparse stays sparse, halves add in float32."""
    scaled = [None if g is None else _scaled(g, weight) for g in grads]
    if total is None:
        return scaled
    out = []
    for t, g in zip(total, scaled):
        if t is None or g is None:
            out.append(g if t is None else t)
        elif isinstance(t, tf.IndexedSlices) and isinstance(g, tf.IndexedSlices):
            out.append(
                tf.IndexedSlices(
                    tf.concat([t.values, g.values], 0),
                    tf.concat([t.indices, g.indices], 0),
                    t.dense_shape,
                )
            )
        else:
            out.append(tf.convert_to_tensor(t) + tf.convert_to_tensor(g))
    return out


def _scaled(grad: Any, weight: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        wide = accumulation_dtype(grad.values.dtype)
        values = tf.cast(grad.values, wide) * weight_in(weight, wide)
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    wide = accumulation_dtype(grad.dtype)
    return tf.cast(grad, wide) * weight_in(weight, wide)


def _cast_back(total: Any, like: Any) -> Any:
    if total is None:
        return None
    if isinstance(total, tf.IndexedSlices):
        dtype = like.values.dtype if isinstance(like, tf.IndexedSlices) else like.dtype
        return tf.IndexedSlices(tf.cast(total.values, dtype), total.indices, total.dense_shape)
    dtype = like.values.dtype if isinstance(like, tf.IndexedSlices) else like.dtype
    return tf.cast(total, dtype)
