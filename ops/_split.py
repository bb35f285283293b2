"""Splitting a batch into per-tower shards whose sizes differ by at most one."""

from typing import Any

from towers.ops._arguments import check_int
from towers.ops._autograph import library_code
from towers.ops._device_scope import device_scope, host_scope
from towers.ops._leaf_paths import leaf_paths
from towers.ops._tensorflow import tf

Nested = Any
_FIX = "Convert it first, e.g. with tf.convert_to_tensor."
_FIXES = {
    "RaggedTensor": "Pad it to a dense tensor first, e.g. `ragged.to_tensor()` (and pass the "
    "row lengths as another input if the model needs them).",
    "SparseTensor": "Make it dense first, e.g. with tf.sparse.to_dense, or split its "
    "indices and values yourself.",
}


def _flat_tensors(inputs: Nested) -> list[tf.Tensor]:
    """Flattens `inputs`, checking every leaf is a tensor with a leading batch dimension."""
    leaves = tf.nest.flatten(inputs)
    if not leaves:
        raise ValueError(f"`inputs` must hold at least one tensor; got {inputs!r}.")
    for path, leaf in zip(_paths(inputs), leaves):
        if not isinstance(leaf, (tf.Tensor, tf.Variable)):
            raise TypeError(
                f"Every leaf of `inputs` must be a dense tf.Tensor; got {type(leaf).__name__} "
                f"at {path}. {_FIXES.get(type(leaf).__name__, _FIX)}"
            )
        if leaf.shape.rank == 0:
            raise ValueError(
                f"Every leaf of `inputs` needs a leading batch dimension; the tensor at {path} "
                "is a scalar."
            )
    return leaves


def _paths(inputs: Nested) -> list[str]:
    """Readable paths of the leaves of `inputs`, in flatten order."""
    return [f"`inputs{p}`" for p in leaf_paths(inputs)]


def _batch_size(inputs: Nested) -> int | tf.Tensor:
    """The shared leading dimension: a Python int when static, else a scalar int32 tensor."""
    leaves = _flat_tensors(inputs)
    static = {p: leaf.shape[0] for p, leaf in zip(_paths(inputs), leaves)}
    known = {p: n for p, n in static.items() if n is not None}
    if len(set(known.values())) > 1:
        raise ValueError(
            f"Every tensor in `inputs` must have the same batch (first) dimension; got "
            f"{', '.join(f'{p}: {n}' for p, n in known.items())}."
        )
    if len(known) == len(leaves):
        return next(iter(known.values()))
    sizes = [tf.shape(leaf, out_type=tf.int32)[0] for leaf in leaves]
    with host_scope():  # (the checks' messages: strings)
        checks = [
            tf.debugging.assert_equal(
                size, sizes[0], message="every tensor in `inputs` must have the same batch size"
            )
            for size in sizes[1:]
        ]
    with tf.control_dependencies(checks):
        return tf.identity(sizes[0])


@library_code
def shard_sizes(inputs: Nested | int | tf.Tensor, num_splits: int) -> list[int | tf.Tensor]:
    """The sizes of the shards `split_batch` makes: exact, differing by at most one.

    The first `batch % num_splits` shards hold one extra example.

    Args:
      inputs: The nested batch given to `split_batch`, or its batch size (int or scalar tensor).
      num_splits: The number of shards (towers), >= 1.

    Returns:
      A list of `num_splits` sizes: Python ints when the batch size is static, else int32
      scalar tensors.

    Raises:
      ValueError: if `num_splits` < 1 or exceeds a static batch size, or inputs disagree on it.
      TypeError: if `num_splits` is not an int or a leaf of `inputs` is not a tensor.

    Example:
      >>> ops.shard_sizes(10, 4)
      [3, 3, 2, 2]
    """
    num_splits = check_int(num_splits, "num_splits", minimum=1)
    if isinstance(inputs, int) and not isinstance(inputs, bool):
        batch = inputs
    elif isinstance(inputs, tf.Tensor) and inputs.shape.rank == 0:
        batch = tf.get_static_value(inputs)
        batch = int(batch) if batch is not None else tf.cast(inputs, tf.int32)
    else:
        batch = _batch_size(inputs)
    if isinstance(batch, int):
        if batch < num_splits:
            raise ValueError(
                f"`num_splits` must be <= the batch size; got num_splits={num_splits}, batch "
                f"size={batch}. Use fewer towers or a larger batch."
            )
        base, extra = divmod(batch, num_splits)
        return [base + (1 if i < extra else 0) for i in range(num_splits)]
    with host_scope():  # (the checks' messages: strings)
        check = tf.debugging.assert_greater_equal(
            batch,
            num_splits,
            message=f"the batch size must be >= num_splits={num_splits} (every tower needs an "
            "example; a last, short batch: drop_remainder=True or fewer towers)",
        )
    with tf.control_dependencies([check]):
        base, extra = batch // num_splits, batch % num_splits
        return tf.unstack(base + tf.cast(tf.range(num_splits) < extra, tf.int32), num_splits)


@library_code
def split_batch(inputs: Nested, num_splits: int, *, device: str | None = "/cpu:0") -> list:
    """Splits every tensor of a nested batch along its first dimension into `num_splits` shards.

    Uneven batches split exactly: shard sizes differ by at most one (see `shard_sizes`). The
    split is built on `device` so that each tower receives only its shard, not the whole batch.

    Args:
      inputs: A nested structure (dicts, tuples, lists) of tensors sharing the batch dimension.
      num_splits: The number of shards, usually the number of towers.
      device: Where to build the split; None keeps the caller's device scope.

    Returns:
      A list of `num_splits` structures like `inputs`, shard i holding rows of example
      `sum(sizes[:i])` to `sum(sizes[:i+1])`.

    Raises:
      ValueError: if the batch is smaller than `num_splits`, inputs disagree on the batch size,
        or a leaf is a scalar.
      TypeError: if a leaf is not a tensor.

    Example:
      >>> shards = ops.split_batch({"x": x, "y": y}, num_splits=4)
      >>> shards[0]["x"]  # the first quarter of x
    """
    sizes = shard_sizes(_batch_size(inputs), num_splits)
    leaves = tf.nest.flatten(inputs)
    with device_scope(device):
        per_leaf = [_split_one(leaf, sizes, num_splits) for leaf in leaves]
    return [
        tf.nest.pack_sequence_as(inputs, [parts[i] for parts in per_leaf])
        for i in range(num_splits)
    ]


def _split_one(tensor: tf.Tensor, sizes: list[int | tf.Tensor], num_splits: int) -> list:
    """Splits one tensor, keeping every static dimension it has."""
    if num_splits == 1:
        return [tf.identity(tensor)]
    parts = tf.split(tensor, sizes, num=num_splits, axis=0)
    if not all(isinstance(size, int) for size in sizes):
        for part in parts:
            part.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return parts
