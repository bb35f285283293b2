"""NVIDIA NCCL all-reduce between the GPUs of one machine (`NcclAllReduce`)."""

import itertools
import uuid

from towers.ops._all_reduce.base import AllReduce, to_wire
from towers.ops._tensorflow import tf


class NcclAllReduce(AllReduce):
    """NVIDIA NCCL all-reduce between the GPUs of one machine (`NcclAllReduce` ops).

    The kernels exist only for GPUs: every device must be a GPU. With `wire_dtype` the sum
    itself runs in that dtype. The K ops of one all-reduce meet by a shared name that this
    instance makes unique (its own id and counter), so instances never meet each other's ops.
    """

    name = "nccl"

    def __init__(self):
        self._prefix = f"towers_nccl_{uuid.uuid4().hex[:12]}"
        self._counter = itertools.count(1)

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """One `NcclAllReduce` per GPU; see `AllReduce.sum`.

        Raises:
          ValueError: if a device is not a GPU.
        """
        for device in devices:
            if tf.DeviceSpec.from_string(device).device_type != "GPU":
                raise ValueError(
                    f"The 'nccl' all-reduce runs only on GPUs; got device {device!r}. Use "
                    "'collective', 'ring' or 'reduce_broadcast' on CPUs."
                )
        shared_name = f"{self._prefix}_{next(self._counter)}"
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
