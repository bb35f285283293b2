"""How a staged shard crosses between the host and its device."""

import tensorflow as tf


def sent(leaf: tf.Tensor, split_device: str, device: str) -> tf.Tensor:
    """A shard as it leaves the host for `device`: a fresh host tensor where it goes to a GPU.

    The dataset's batch and the split's shards (slices of it) are pageable host memory, and
    their copy to a GPU went by the driver's pageable copy: synchronous, about 6 GB/s,
    holding its thread (wave 5, session 40, on an H100: the ResNet-50's 154 MB batch
    took 21-25 ms, in series with the step's program in every traced step).
    A host op's output that feeds a copy to a GPU is allocated in pinned memory (the
    executor asks for GPU-compatible memory), so a copy made on the host first makes the
    transfer an asynchronous DMA. On CPU devices the shard goes as it is.
    """
    if not _host_to_gpu(split_device, device):
        return leaf
    with tf.device(split_device):
        return tf.raw_ops.DeepCopy(x=leaf)


def _host_to_gpu(source: str, device: str) -> bool:
    return _local(source)[0] == "CPU" and _local(device)[0] == "GPU"


def read_on(buffer: tf.Variable, device: str) -> tf.Tensor:
    """The buffer's shard, on `device` (a shard kept on the host is read there)."""
    with tf.device(buffer.device):
        value = buffer.read_value()
    if _local(buffer.device) != _local(device):
        with tf.device(device):
            return tf.identity(value)
    return value


def _local(device: str) -> tuple[str, int]:
    spec = tf.DeviceSpec.from_string(device)
    return spec.device_type.upper(), spec.device_index or 0
