"""All-reduce algorithms sharing one contract: K values on K devices in, K sums out."""

from collections.abc import Sequence

from ops._tensorflow import tf

REDUCTIONS = ("sum", "mean")
WIRE_DTYPES = (None, tf.float16, tf.bfloat16)


class AllReduce:
    """Base of the algorithms: validation, K=1, mean and transfer dtype are handled here.

    Call an algorithm as `algorithm(values, devices, reduction="sum", wire_dtype=None)`:
    `values[i]` lives on `devices[i]`; the result is K tensors, result i on `devices[i]`, all
    equal to the sum (or mean) of the values. With `wire_dtype` (float16 or bfloat16) values
    cross devices in that dtype; the plain-op algorithms accumulate in the values' dtype.
    """

    name = "base"

    @tf.autograph.experimental.do_not_convert
    def __call__(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """All-reduces `values`; see the class docstring.

        Raises:
          ValueError: if values and devices differ in number, values differ in shape or
            dtype, or `reduction` or `wire_dtype` is unknown.
        """
        values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
        _check(values, devices, reduction, wire_dtype)
        if len(values) == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        summed = self._sum(values, devices, wire_dtype)
        if reduction == "sum":
            return summed
        out = []
        for value, device in zip(summed, devices):
            with tf.device(device):
                out.append(value / tf.cast(len(values), value.dtype))
        return out

    def _sum(self, values: list, devices: list, wire_dtype) -> list:
        raise NotImplementedError


def _check(values: list, devices: list, reduction: str, wire_dtype) -> None:
    if not values or len(values) != len(devices):
        raise ValueError(
            f"All-reduce needs one value per device; got {len(values)} values and "
            f"{len(devices)} devices."
        )
    first = values[0]
    for i, value in enumerate(values[1:], start=1):
        if value.dtype != first.dtype or not value.shape.is_compatible_with(first.shape):
            raise ValueError(
                f"All-reduced values must agree in shape and dtype; value 0 is "
                f"{first.dtype.name}{first.shape} and value {i} is {value.dtype.name}{value.shape}."
            )
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}; got {reduction!r}.")
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(
            f"`wire_dtype` must be None, tf.float16 or tf.bfloat16; got {wire_dtype!r}."
        )


def to_wire(value: tf.Tensor, wire_dtype) -> tf.Tensor:
    return value if wire_dtype is None else tf.cast(value, wire_dtype)


class ReduceBroadcast(AllReduce):
    """Sums every value on one device (default the first), then copies the sum to each device.

    Args:
      reduce_device: Where to sum; None for the first value's device.
    """

    name = "reduce_broadcast"

    def __init__(self, reduce_device: str | None = None):
        self.reduce_device = reduce_device

    def _sum(self, values, devices, wire_dtype):
        dtype = values[0].dtype
        sent = []
        for value, device in zip(values, devices):
            with tf.device(device):
                sent.append(to_wire(value, wire_dtype))
        with tf.device(self.reduce_device or devices[0]):
            total = to_wire(tf.add_n([tf.cast(v, dtype) for v in sent]), wire_dtype)
        out = []
        for device in devices:
            with tf.device(device):
                out.append(tf.cast(tf.identity(total), dtype))
        return out


class Ring(AllReduce):
    """Reduce-scatter then all-gather over K chunks, made of plain ops.

    Chunk c is summed hop by hop around the ring and ends on device c; then every device
    gathers all K chunk sums. Each device sends about 2 (K-1)/K of the data, and every chunk
    sum is computed once, so all results are bitwise identical.
    """

    name = "ring"

    def _sum(self, values, devices, wire_dtype):
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
                chunks.append(tf.split(flat, sizes, num=k))
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
