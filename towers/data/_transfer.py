"""How a staged shard crosses between the host and its device."""

import tensorflow as tf

from towers.ops.internal import in_task

# What DeepCopy's CPU kernel copies (TensorFlow's `inplace_ops.cc`: number types and bool);
# a 4-bit integer a GPU variable holds would fail there, and goes as it is.
_COPIED = frozenset(
    (tf.bool, tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.complex64, tf.complex128)
    + (tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64)
)


def sent(leaf: tf.Tensor, split_device: str | None, device: str) -> tf.Tensor:
    """A shard as it leaves the host for `device`: a fresh host tensor where it goes to a GPU.

    The dataset's batch and the split's shards (slices of it) are host memory TensorFlow
    did not allocate for a transfer. Their copy to a GPU was slow: on an H100 (wave 5,
    session 40) the ResNet-50's 154 MB batch held its sending thread and the host-to-device
    stream 21-25 ms (about 6 GB/s, the speed of the driver's pageable copy), in series with
    the step's program in every traced step. In a graph, a host op's output that feeds a
    copy to a GPU is allocated in pinned memory (the executor asks for GPU-compatible
    memory), so a copy made on the host first makes the transfer an asynchronous DMA (2.8
    ms there). Eagerly (the first batch, a restored one) it is one more host copy. On CPU
    devices, from a split on a GPU or of a dtype the copy cannot take, the shard goes as it
    is.
    """
    if not _host_to_gpu(split_device, device) or leaf.dtype not in _COPIED:
        return leaf
    with tf.device(split_device):
        return tf.raw_ops.DeepCopy(x=leaf)


def _host_to_gpu(source: str | None, device: str) -> bool:
    """Whether `source` is a CPU and `device` a GPU of its own task (a host-to-device copy).

    A shard bound for another task's GPU crosses the network, for which the executor does
    not allocate pinned memory: it goes as it is.
    """
    return _local(source)[0] == "CPU" and _local(device)[0] == "GPU" and in_task(source, device)


def read_on(buffer: tf.Variable, device: str) -> tf.Tensor:
    """The buffer's shard, on `device` (a shard kept on the host is read there)."""
    with tf.device(buffer.device):
        value = buffer.read_value()
    if _local(buffer.device) != _local(device):
        with tf.device(device):
            return tf.identity(value)
    return value


def _local(device: str | None) -> tuple[str, int]:
    """(type, index) of a device name; a name without a type (None, "/job:localhost") has ""."""
    spec = tf.DeviceSpec.from_string(device or "")
    return (spec.device_type or "").upper(), spec.device_index or 0
