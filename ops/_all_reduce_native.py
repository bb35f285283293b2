"""TensorFlow's native all-reduce kernels behind the `AllReduce` contract: collectives, NCCL."""

import itertools

from ops._all_reduce import AllReduce, to_wire
from ops._tensorflow import tf


class Collective(AllReduce):
    """TensorFlow's collective all-reduce (`CollectiveReduceV2`; NCCL on GPUs).

    Each device's collectives are ordered by a per-device token (a resource variable), as
    TensorFlow's own `CollectiveAllReduce` does: without that order the K ops of one function
    may start in different orders on different devices and wait for each other forever.
    Build it inside `tf.function`; a v1 graph has no automatic ordering. With `wire_dtype`
    the sum itself runs in that dtype.

    Args:
      timeout_seconds: How long a collective may wait for its peers before failing.
    """

    name = "collective"
    # Group keys must be unique in the process; tf.distribute's own count from 1.
    _group_keys = itertools.count(0x70770000)

    def __init__(self, timeout_seconds: float = 120.0):
        self.timeout_seconds = timeout_seconds
        self._tokens: dict[str, tf.Variable] = {}
        self._groups: dict[tuple, int] = {}
        self._instance_keys = itertools.count(1)

    def _sum(self, values, devices, wire_dtype):
        if not tf.compat.v1.executing_eagerly_outside_functions():
            raise ValueError(
                "The 'collective' all-reduce needs tf.function (TF2); in a v1 graph use 'ring' "
                "or 'reduce_broadcast'."
            )
        if tuple(devices) not in self._groups:
            self._groups[tuple(devices)] = next(Collective._group_keys)
        group = self._groups[tuple(devices)]
        instance = next(self._instance_keys)
        out = []
        for value, device in zip(values, devices):
            with tf.device(device):
                summed = tf.raw_ops.CollectiveReduceV2(
                    input=to_wire(value, wire_dtype),
                    group_size=len(devices),
                    group_key=group,
                    instance_key=instance,
                    ordering_token=[self._token(device).handle],
                    merge_op="Add",
                    final_op="Id",
                    timeout_seconds=self.timeout_seconds,
                )
                out.append(tf.cast(summed, value.dtype))
        return out

    def _token(self, device: str) -> tf.Variable:
        if device not in self._tokens:
            with tf.init_scope(), tf.device(device):
                self._tokens[device] = tf.Variable(0.0, trainable=False, name="ordering_token")
        return self._tokens[device]


class Nccl(AllReduce):
    """NVIDIA NCCL all-reduce between the GPUs of one machine (`NcclAllReduce`).

    The kernels exist only for GPUs: every device must be a GPU. With `wire_dtype` the sum
    itself runs in that dtype.
    """

    name = "nccl"
    _shared_names = itertools.count(1)

    def _sum(self, values, devices, wire_dtype):
        for device in devices:
            if tf.DeviceSpec.from_string(device).device_type != "GPU":
                raise ValueError(
                    f"The 'nccl' all-reduce runs only on GPUs; got device {device!r}. Use "
                    "'collective', 'ring' or 'reduce_broadcast' on CPUs."
                )
        shared_name = f"towers_nccl_{next(Nccl._shared_names)}"
        out = []
        for value, device in zip(values, devices):
            with tf.device(device):
                summed = tf.raw_ops.NcclAllReduce(
                    input=to_wire(value, wire_dtype),
                    reduction="sum",
                    num_devices=len(devices),
                    shared_name=shared_name,
                )
                out.append(tf.cast(summed, value.dtype))
        return out
