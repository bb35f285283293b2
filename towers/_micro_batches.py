"""Running one tower's shard as several micro-batches in sequence, gradients accumulated."""

from collections.abc import Callable
from typing import Any

from towers import ops
from towers.ops._tensorflow import tf


def check_micro_batches(micro_batches: Any) -> int:
    """`micro_batches` as an int >= 1, or a clear error.

    Raises:
      TypeError: if it is not an int.
      ValueError: if it is < 1.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
        raise TypeError(f"`micro_batches` must be an int; got {micro_batches!r}.")
    if micro_batches < 1:
        raise ValueError(f"`micro_batches` must be >= 1; got micro_batches={micro_batches}.")
    return micro_batches


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
    losses, outputs, grads, before = [], [], [], []
    for part in parts:
        if before:
            with tf.control_dependencies(before):
                part = tf.nest.map_structure(tf.identity, part)
        loss, out, part_grads = one_pass(part)
        losses.append(loss)
        outputs.append(out)
        grads.append(part_grads)
        before = [
            g.values if isinstance(g, tf.IndexedSlices) else g for g in part_grads if g is not None
        ]
    loss = ops.merge_outputs(losses, "mean", weights=sizes)
    merged = None if outputs[0] is None else ops.merge_outputs(outputs, merge, weights=sizes)
    return loss, merged, ops.average_gradients(grads, weights=sizes)
