"""NVIDIA NCCL all-reduce between the GPUs of one machine (`NcclAllReduce`)."""

import itertools
import uuid
from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.transfers import to_wire
from towers.ops._autograph import library_code
from towers.ops._tensorflow import tf


class NcclAllReduce(AllReduce):
    """NVIDIA NCCL all-reduce between the GPUs of one machine (`NcclAllReduce` ops).

    The kernels exist only for GPUs, and NCCL runs one rank per physical GPU: every device must
    be a GPU of this process, each on a physical GPU of its own (logical GPUs split from one
    GPU by `towers.simulate_devices(k, "GPU", ...)` cannot take part). With `wire_dtype` the
    sum itself runs in that dtype. The K ops of one all-reduce meet by a shared name that this
    instance makes unique (its own id and counter), so instances never meet each other's ops.
    """

    name = "nccl"

    def __init__(self):
        self._prefix = f"towers_nccl_{uuid.uuid4().hex[:12]}"
        self._counter = itertools.count(1)

    @staticmethod
    @library_code
    def refusal(devices: Sequence[str]) -> str | None:
        """Why NCCL cannot all-reduce over `devices`, or None when it can.

        Args:
          devices: Canonical device names.

        Returns:
          A sentence naming the first device that is not a GPU, or two devices that share a
          physical GPU; None when every device is a GPU of its own.
        """
        physical = physical_gpu_of_logical()
        seen = {}
        for device in devices:
            spec = tf.DeviceSpec.from_string(device)
            if spec.device_type != "GPU":
                return f"the 'nccl' all-reduce runs only on GPUs; got device {device!r}"
            index = physical[spec.device_index] if spec.device_index < len(physical) else None
            if index is not None and index in seen:
                return (
                    f"NCCL runs one rank per physical GPU, and {seen[index]!r} and {device!r} "
                    f"are logical devices of the same physical GPU {index}"
                )
            seen.setdefault(index, device)
        return None

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """One `NcclAllReduce` per GPU; see `AllReduce.sum`.

        Raises:
          ValueError: if a device is not a GPU, or two share a physical GPU.
        """
        refusal = self.refusal(devices)
        if refusal is not None:
            raise ValueError(
                f"Cannot all-reduce with NCCL: {refusal}. Use 'collective', 'ring' or "
                "'reduce_broadcast' (or 'auto', which picks NCCL only where it can run)."
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


@library_code
def physical_gpu_of_logical() -> list[int]:
    """The visible physical GPU (its position among them) of each logical GPU, in order.

    TensorFlow numbers logical GPUs through the visible physical GPUs in turn, each split into
    as many as its `tf.config` logical configuration has (one when it has none).
    """
    out = []
    for number, gpu in enumerate(tf.config.get_visible_devices("GPU")):
        out += [number] * len(tf.config.get_logical_device_configuration(gpu) or [None])
    return out
