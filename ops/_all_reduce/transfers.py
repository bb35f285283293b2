"""Moving values between devices: the sum of K values on one device, one value to K devices.

Values leave their devices in an optional narrower `wire_dtype` and are added in their own.
"""

from towers.ops._tensorflow import tf


def to_wire(value: tf.Tensor, wire_dtype: tf.DType | None) -> tf.Tensor:
    """`value` cast to the transfer dtype, or unchanged without one."""
    return value if wire_dtype is None else tf.cast(value, wire_dtype)


def sum_on(
    device: str, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
) -> tf.Tensor:
    """The sum of `values` (value i on `devices[i]`), built on `device`.

    Values leave their devices in `wire_dtype` and are added in their own dtype.
    """
    dtype = values[0].dtype
    sent = []
    for value, source in zip(values, devices):
        with tf.device(source):
            sent.append(to_wire(value, wire_dtype))
    with tf.device(device):
        return tf.add_n([tf.cast(v, dtype) for v in sent])


def spread(
    total: tf.Tensor, source: str, devices: list[str], dtype: tf.DType, wire_dtype: tf.DType | None
) -> list[tf.Tensor]:
    """`total` (on `source`) copied to each of `devices`, sent in `wire_dtype`, as `dtype`.

    Every copy is the same cast of the same sent tensor: bitwise equal everywhere.
    """
    with tf.device(source):
        sent = to_wire(total, wire_dtype)
    out = []
    for device in devices:
        with tf.device(device):
            out.append(tf.cast(tf.identity(sent), dtype))
    return out
