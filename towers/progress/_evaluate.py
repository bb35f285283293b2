"""Evaluation on every device: a forward pass over a dataset, metrics weighted by examples."""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import towers.ops as ops
from towers.core import device_list
from towers.step import replicate
from towers.variables import VariableStrategy


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What `towers.evaluate` found.

    Attributes:
      metrics: Each metric's mean over every example of the dataset.
      examples: How many examples were evaluated.
      outputs: The outputs of every example, concatenated in dataset order (numpy, in the
        structure `fn` returned), or None when `fn` returned only metrics.
    """

    metrics: dict[str, float]
    examples: int
    outputs: Any = None


def evaluate(
    fn: Callable[[Any], Any],
    dataset: Iterable[Any],
    devices: Sequence[str],
    *,
    variable_strategy: VariableStrategy | None = None,
) -> Evaluation:
    """Runs `fn` on every batch of `dataset`, each split over the towers, and averages.

    Each batch is split over `devices` (a last batch with fewer examples than devices gets
    one example per tower, padded with copies that are not counted); `fn(shard)` runs in
    each tower and returns a dict of metrics, or a pair `(metrics, outputs)`. A metric is
    either one value per example (shape [n]: averaged over all examples) or a scalar, the
    shard's mean (weighted by the shard's size). The means are exact over the whole dataset,
    partial last batch included: sums are kept in float64. Each call traces `fn` anew (once
    for full batches, once more for a padded last batch).

    Args:
      fn: Called with one shard in each tower; builds no training ops.
      dataset: Batches: a `tf.data.Dataset` (iterated eagerly) or any iterable of nested
        tensors or arrays with a leading batch dimension.
      devices: One device per tower.
      variable_strategy: As in `towers.replicate` (with `towers.Replicated`, `fn` reads
        `model.local()`).

    Returns:
      An `Evaluation`.

    Raises:
      TypeError: if `fn` returns no dict of metrics.
      ValueError: if a metric is neither a scalar nor one value per example, or the dataset
        is empty.

    Example:
      >>> def fn(shard):
      ...     logits = model(shard["image"])
      ...     correct = tf.cast(tf.argmax(logits, 1) == shard["label"], tf.float32)
      ...     return {"accuracy": correct}
      >>> towers.evaluate(fn, test_batches, devices).metrics["accuracy"]
    """
    devices = device_list(devices)
    step = _step(fn, variable_strategy)
    sums: dict[str, float] = {}
    examples, outputs = 0, []
    for batch in dataset:
        batch = tf.nest.map_structure(tf.convert_to_tensor, batch)
        size = int(tf.shape(tf.nest.flatten(batch)[0])[0])
        if size == 0:
            continue
        if size < len(devices):  # one example per tower: copies of the last fill the rest
            batch = tf.nest.map_structure(lambda t, n=size: _padded(t, n, len(devices)), batch)
        batch_sums, batch_outputs = step(batch, tuple(devices), min(size, len(devices)))
        for name, value in batch_sums.items():
            sums[name] = sums.get(name, 0.0) + float(np.asarray(value, np.float64))
        examples += size
        if batch_outputs is not None:
            outputs.append(tf.nest.map_structure(np.asarray, batch_outputs))
    if not examples:
        raise ValueError("`dataset` held no examples to evaluate.")
    merged = None
    if outputs:
        merged = tf.nest.map_structure(lambda *parts: np.concatenate(parts), *outputs)
    return Evaluation({name: total / examples for name, total in sums.items()}, examples, merged)


def _step(fn: Callable, variable_strategy: VariableStrategy | None) -> Callable:
    """A `tf.function` of (batch, devices, counted): metric sums and outputs of the batch.

    Only the first `counted` towers count; the others hold padding.
    """

    @tf.function
    def step(batch: Any, devices: tuple, counted: int) -> tuple[dict, Any]:
        shards = ops.split_batch(batch, len(devices))
        sizes = ops.shard_sizes(batch, len(devices))
        per_tower = replicate(fn, shards, list(devices), variable_strategy=variable_strategy)
        sums: dict[str, tf.Tensor] = {}
        outputs = []
        for result, size in list(zip(per_tower, sizes))[:counted]:
            metrics, tower_outputs = _metrics_and_outputs(result)
            for name, value in metrics.items():
                total = _sum(name, value, size)
                sums[name] = sums[name] + total if name in sums else total
            outputs.append(tower_outputs)
        if outputs[0] is None:
            return sums, None
        return sums, ops.merge_outputs(outputs, "concat")

    return step


def _padded(tensor: tf.Tensor, size: int, num: int) -> tf.Tensor:
    """`tensor`'s `size` examples, then its last repeated up to `num` examples."""
    last = tensor[size - 1 : size]
    return tf.concat([tensor[:size]] + [last] * (num - size), 0)


def _metrics_and_outputs(result: Any) -> tuple[dict, Any]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict):
        metrics, outputs = result
    else:
        metrics, outputs = result, None
    if not isinstance(metrics, dict) or not metrics:
        raise TypeError(
            "`fn` must return a non-empty dict of metrics (name -> per-example values or a "
            f"scalar mean), or a pair (metrics, outputs); got {type(result).__name__}."
        )
    return metrics, outputs


def _sum(name: str, value: Any, size: Any) -> tf.Tensor:
    """A metric's sum over the shard: its values summed, or the shard mean times its size."""
    value = tf.cast(value, tf.float64)
    if value.shape.rank == 0:
        return value * tf.cast(size, tf.float64)
    if value.shape.rank == 1:
        if isinstance(size, int) and value.shape[0] not in (None, size):
            raise ValueError(
                f"Metric {name!r} has {value.shape[0]} values for a shard of {size} examples; "
                "return one value per example, or a scalar mean."
            )
        return tf.reduce_sum(value)
    raise ValueError(
        f"Metric {name!r} must be a scalar (the shard's mean) or one value per example "
        f"(shape [n]); got shape {value.shape}."
    )
