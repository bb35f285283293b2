"""All-reduce by summing on one device and copying the sum back to every device."""

from towers.ops._all_reduce import parts
from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.transfers import spread, sum_on
from towers.ops._tensorflow import tf


class ReduceBroadcastAllReduce(AllReduce):
    """Sums every value on one device (default the first), then copies the sum to each device.

    The fewest ops of all algorithms: the best for small tensors and for CPU devices.

    Args:
      reduce_device: Where to sum; None for the first value's device.
    """

    name = "reduce_broadcast"

    def __init__(self, reduce_device: str | None = None):
        self.reduce_device = reduce_device

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Adds on `reduce_device`, then one copy per device; see `AllReduce.sum`."""
        device = self.reduce_device or devices[0]
        total = sum_on(device, values, devices, wire_dtype)
        return spread(total, device, devices, values[0].dtype, wire_dtype)

    def scatter_sum(
        self,
        values: list[tf.Tensor],
        devices: list[str],
        sizes: list[int],
        wire_dtype: tf.DType | None,
    ) -> list[tf.Tensor]:
        """Part i summed on device i: each device adds only its part; see `AllReduce`."""
        return [
            sum_on(device, parts.part_of(values, devices, sizes, i), devices, wire_dtype)
            for i, device in enumerate(devices)
        ]

    def gather_parts(
        self, values: list[tf.Tensor], devices: list[str], sizes: list[int]
    ) -> list[tf.Tensor]:
        """Every part copied to every device and concatenated; see `AllReduce`."""
        del sizes
        return parts.concatenated(values, devices)
