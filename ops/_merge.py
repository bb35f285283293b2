"""Merging per-tower outputs back into one value per output."""

from collections.abc import Sequence
from typing import Any

from towers.ops._autograph import library_code
from towers.ops._device_scope import device_scope
from towers.ops._leaf_paths import leaf_paths
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import Weight, normalized_weights, weighted_sum

MODES = ("concat", "mean", "sum", "stack")


@library_code
def merge_outputs(
    per_tower: Sequence[Any],
    mode: str | Any,
    *,
    weights: Sequence[Weight] | None = None,
    device: str | None = None,
) -> Any:
    """Merges a list of per-tower nested outputs into one nested output.

    The caller chooses how; nothing is guessed from shapes.

    Args:
      per_tower: A list of K structures of tensors, one per tower, all of the same structure.
      mode: One of "concat" (along the first axis, the inverse of `split_batch`), "mean"
        (weighted by `weights` when given), "sum", "stack" (a new leading axis of size K); or a
        structure like one tower's output holding one of these per leaf.
      weights: K weights for the "mean" leaves, typically the shard sizes; normalized to sum to
        one. Other modes ignore them.
      device: Where to build the merge; None keeps the caller's device scope.

    Returns:
      A structure like one tower's output.

    Raises:
      ValueError: if `per_tower` is empty, towers disagree on structure, `mode` is unknown, or a
        scalar is concatenated.
      TypeError: if "mean" is asked of a non-floating tensor.

    Example:
      >>> merged = ops.merge_outputs(per_tower, {"logits": "concat", "loss": "mean"},
      ...                            weights=ops.shard_sizes(batch, k))
    """
    per_tower = list(per_tower)
    if not per_tower:
        raise ValueError("`per_tower` must hold at least one tower's outputs; got [].")
    first = per_tower[0]
    for i, other in enumerate(per_tower[1:], start=1):
        try:
            tf.nest.assert_same_structure(first, other)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"Every tower must return the same structure; tower 0 and tower {i} differ: {error}"
            ) from None
    modes = _leaf_modes(mode, first)
    norm = normalized_weights(weights, len(per_tower), "merge_outputs") if "mean" in modes else None
    paths = leaf_paths(first)
    columns = zip(*(tf.nest.flatten(out) for out in per_tower))
    with device_scope(device):
        merged = [
            _merge_leaf(list(values), leaf_mode, norm, path)
            for values, leaf_mode, path in zip(columns, modes, paths)
        ]
    return tf.nest.pack_sequence_as(first, merged)


def _leaf_modes(mode: Any, structure: Any) -> list[str]:
    """One validated mode per leaf of `structure`."""
    if isinstance(mode, str):
        modes = [mode] * len(tf.nest.flatten(structure))
    else:
        try:
            tf.nest.assert_same_structure(mode, structure)
        except (ValueError, TypeError):
            shape = tf.nest.map_structure(lambda _: "...", structure)
            raise ValueError(
                f"`mode` must be one of {MODES} or a structure like one tower's output; got "
                f"{mode!r} for outputs shaped like {shape}."
            ) from None
        modes = tf.nest.flatten(mode)
    for leaf_mode in modes:
        if leaf_mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}; got {leaf_mode!r}.")
    return modes


def _merge_leaf(values: list, mode: str, weights: list | None, path: str) -> tf.Tensor:
    """Merges the K towers' values of one output."""
    values = [tf.convert_to_tensor(v) for v in values]
    where = f"output `outputs{path}`" if path else "the output"
    if mode == "concat":
        if values[0].shape.rank == 0:
            raise ValueError(
                f"Cannot concatenate {where}: it is a scalar in each tower. Use mode 'mean', "
                "'sum' or 'stack' for it."
            )
        return tf.concat(values, axis=0)
    if mode == "stack":
        return tf.stack(values, axis=0)
    if mode == "sum":
        return tf.add_n(values)
    dtype = values[0].dtype
    if not dtype.is_floating:
        raise TypeError(
            f"Mode 'mean' needs floating-point values; {where} is {dtype.name}. Use 'sum' or "
            "cast it first."
        )
    return weighted_sum(values, weights)
