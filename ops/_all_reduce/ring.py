"""Ring all-reduce from plain ops: reduce-scatter, then all-gather."""

from towers.ops._all_reduce.base import AllReduce, to_wire
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
        k, dtype, shape = len(values), values[0].dtype, values[0].shape
        if not shape.is_fully_defined():
            with tf.device(devices[0]):
                shape = tf.shape(values[0])
        chunks = []
        for value, device in zip(values, devices):
            with tf.device(device):
                flat = tf.reshape(value, [-1])
                n = tf.size(flat)
                sizes = n // k + tf.cast(tf.range(k) < n % k, n.dtype)
                chunks.append(_chunks(flat, sizes, k, device))
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
        out = []
        for device in devices:
            with tf.device(device):
                gathered = tf.concat([tf.cast(tf.identity(s), dtype) for s in sums], axis=0)
                out.append(tf.reshape(gathered, shape))
        return out


def _chunks(flat: tf.Tensor, sizes: tf.Tensor, k: int, device: str) -> list[tf.Tensor]:
    """`flat` cut into K chunks of `sizes`: one split, or K slices where no split runs.

    A GPU has no `SplitV` kernel for int64 (nor other integers but int32); slices run there.
    """
    if has_kernel("SplitV", device, T=flat.dtype):
        return tf.split(flat, sizes, num=k)
    ends = tf.cumsum(sizes)
    return [flat[ends[c] - sizes[c] : ends[c]] for c in range(k)]
