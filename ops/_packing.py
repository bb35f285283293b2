"""Packing many small tensors into a few flat buckets, and back."""

import dataclasses
from collections.abc import Sequence

from towers.ops._arguments import check_int
from towers.ops._autograph import library_code
from towers.ops._tensorflow import tf


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How `pack` laid tensors out, so `unpack` can undo it.

    Attributes:
      buckets: For each bucket, the indices of the tensors it holds, in order.
      shapes: The static shape of every tensor.
    """

    buckets: tuple[tuple[int, ...], ...]
    shapes: tuple[tf.TensorShape, ...]

    @property
    def sizes(self) -> list[list[int]]:
        """For each bucket, the sizes of the tensors it holds, in order."""
        return [[self.shapes[i].num_elements() for i in members] for members in self.buckets]


@library_code
def pack_spec(tensors: Sequence[tf.Tensor], bucket_bytes: int) -> PackSpec:
    """Groups tensors, in order, into buckets of one dtype and at most `bucket_bytes` each.

    A tensor larger than `bucket_bytes` gets a bucket of its own; the bucket open before it
    stays open for the tensors after it.

    Args:
      tensors: Tensors with fully defined shapes.
      bucket_bytes: The largest bucket, in bytes; > 0.

    Returns:
      The `PackSpec`, which depends only on shapes and dtypes: every tower's gradients of one
      model share it.

    Raises:
      ValueError: if `bucket_bytes` <= 0 or a shape is not fully defined.
    """
    if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"`bucket_bytes` must be a positive int; got {bucket_bytes!r}.")
    open_buckets: dict[tf.DType, tuple[list[int], int]] = {}
    buckets = []
    for i, tensor in enumerate(tensors):
        if not tensor.shape.is_fully_defined():
            raise ValueError(
                f"Packing needs static shapes; tensor #{i} has shape {tensor.shape}. Pass "
                "bucket_bytes=None to reduce tensors one by one."
            )
        size = tensor.shape.num_elements() * tensor.dtype.size
        if size > bucket_bytes:  # alone, and the small ones around it still share one
            buckets.append((i,))
            continue
        members, used = open_buckets.get(tensor.dtype, ([], 0))
        if members and used + size > bucket_bytes:
            buckets.append(tuple(members))
            members, used = [], 0
        open_buckets[tensor.dtype] = (members + [i], used + size)
    buckets += [tuple(members) for members, _ in open_buckets.values() if members]
    return PackSpec(tuple(sorted(buckets)), tuple(t.shape for t in tensors))


def check_bucket_bytes(bucket_bytes: int | None) -> None:
    """Checks a `bucket_bytes` option: a positive int, or None for no packing.

    Raises:
      TypeError, ValueError: naming the option and the value received.
    """
    check_int(bucket_bytes, "bucket_bytes", minimum=1, none=True)  # None: no packing


@library_code
def pack(tensors: Sequence[tf.Tensor], spec: PackSpec) -> list[tf.Tensor]:
    """Flattens and concatenates the tensors of each bucket: one 1-D tensor per bucket.

    Args:
      tensors: Tensors matching `spec` (shapes and dtypes).
      spec: From `pack_spec`.

    Returns:
      One flat tensor per bucket; the inverse of `unpack`.
    """
    flat_shape = []  # one shape constant for every reshape (one op each, not two)

    def flat(tensor: tf.Tensor) -> tf.Tensor:
        if tensor.shape.rank == 1:  # a vector is already flat: no op
            return tensor
        if not flat_shape:
            flat_shape.append(tf.constant([-1], tf.int32))
        return tf.raw_ops.Reshape(tensor=tensor, shape=flat_shape[0])

    buckets = []
    for members in spec.buckets:  # only the tensors a bucket holds
        parts = [flat(tensors[i]) for i in members]
        buckets.append(tf.concat(parts, axis=0) if len(parts) > 1 else parts[0])
    return buckets


@library_code
def unpack(buckets: Sequence[tf.Tensor], spec: PackSpec) -> list[tf.Tensor]:
    """Splits packed buckets back into tensors of their original shapes and order.

    Args:
      buckets: Flat tensors as `pack` made them (possibly reduced since).
      spec: The `PackSpec` they were packed with.

    Returns:
      The tensors, in the order given to `pack`.
    """
    out: list = [None] * len(spec.shapes)
    for members, flat in zip(spec.buckets, buckets):
        sizes = [spec.shapes[i].num_elements() for i in members]
        parts = tf.split(flat, sizes, num=len(sizes)) if len(sizes) > 1 else [flat]
        for i, part in zip(members, parts):
            out[i] = part if spec.shapes[i].rank == 1 else tf.reshape(part, spec.shapes[i])
    return out
