"""Ring all-reduce from plain ops: reduce-scatter, then all-gather."""

from typing import Any

from towers.ops._all_reduce import parts
from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.transfers import to_wire
from towers.ops._kernels import has_kernel
from towers.ops._tensorflow import tf


class RingAllReduce(AllReduce):
    """Reduce-scatter then all-gather over K chunks, made of plain ops.

    Chunk c is summed hop by hop around the ring and ends on device c; then every device
    gathers all K chunk sums. Each device sends about 2 (K-1)/K of the data, and every chunk
    sum is computed once, so all results are bitwise identical.
    """

    name = "ring"

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Sums chunk by chunk around the ring; see `AllReduce.sum`."""
        k, shape = len(values), values[0].shape
        if not shape.is_fully_defined():
            with tf.device(devices[0]):
                shape = tf.shape(values[0])
        flats = []
        for value, device in zip(values, devices):
            with tf.device(device):
                flats.append(tf.reshape(value, [-1]))
        with tf.device(devices[0]):
            n = tf.size(flats[0])
            sizes = n // k + tf.cast(tf.range(k) < n % k, n.dtype)
        gathered = parts.concatenated(_chunk_sums(flats, devices, sizes, wire_dtype), devices)
        out = []
        for total, device in zip(gathered, devices):
            with tf.device(device):  # sent in the wire dtype, cast back here
                out.append(tf.reshape(tf.cast(total, values[0].dtype), shape))
        return out

    def scatter_sum(
        self,
        values: list[tf.Tensor],
        devices: list[str],
        sizes: list[int],
        wire_dtype: tf.DType | None,
    ) -> list[tf.Tensor]:
        """The ring's first half: chunk i, summed hop by hop, ends on device i."""
        row = values[0].shape[1:]
        flats = []
        for value, device in zip(values, devices):
            with tf.device(device):
                flats.append(tf.reshape(value, [-1]))
        if row.num_elements() is None:
            return super().scatter_sum(values, devices, sizes, wire_dtype)
        elements = [n * row.num_elements() for n in sizes]
        out = []
        for chunk, size, device in zip(
            _chunk_sums(flats, devices, elements, wire_dtype), sizes, devices
        ):
            with tf.device(device):
                out.append(tf.reshape(tf.cast(chunk, values[0].dtype), [size, *row]))
        return out

    def gather_parts(
        self, values: list[tf.Tensor], devices: list[str], sizes: list[int]
    ) -> list[tf.Tensor]:
        """The ring's second half: every device gathers every part."""
        del sizes
        return parts.concatenated(values, devices)


def _chunk_sums(
    flats: list[tf.Tensor], devices: list[str], sizes: Any, wire_dtype: tf.DType | None
) -> list:
    """Chunk c of every flat value summed around the ring, ending on device c (wire dtype).

    Each device sends about (K-1)/K of the data, and every chunk sum is computed once.
    """
    k, dtype = len(flats), flats[0].dtype
    chunks = [_chunks(flat, sizes, k, device) for flat, device in zip(flats, devices)]
    sums = []
    for c in range(k):
        first = (c + 1) % k
        with tf.device(devices[first]):
            acc = to_wire(chunks[first][c], wire_dtype)
        for hop in range(2, k + 1):
            d = (c + hop) % k
            with tf.device(devices[d]):
                acc = to_wire(tf.cast(acc, dtype) + chunks[d][c], wire_dtype)
        sums.append(acc)
    return sums


def _chunks(flat: tf.Tensor, sizes: Any, k: int, device: str) -> list[tf.Tensor]:
    """`flat` cut into K chunks of `sizes`: one split, or K slices where no split runs.

    A GPU has no `SplitV` kernel for int64 (nor other integers but int32); slices run there.
    """
    with tf.device(device):
        if has_kernel("SplitV", device, T=flat.dtype):
            return tf.split(flat, sizes, num=k)
        ends = tf.cumsum(sizes)
        return [flat[ends[c] - sizes[c] : ends[c]] for c in range(k)]
