"""Choosing an all-reduce algorithm: by name, or automatically by device type and size."""

from collections.abc import Sequence

from ops._all_reduce import AllReduce, ReduceBroadcast, Ring
from ops._all_reduce_native import Collective, Nccl
from ops._tensorflow import tf


class Auto(AllReduce):
    """Chooses by device type and size: NCCL between GPUs, otherwise by bytes on CPUs.

    Args:
      small_bytes: On CPUs, values up to this size go through `ReduceBroadcast` (fewest ops),
        larger ones through `Ring` (spreads the additions over the devices).
    """

    name = "auto"

    def __init__(self, small_bytes: int = 64 * 1024):
        self.small_bytes = small_bytes
        self._nccl, self._small, self._large = Nccl(), ReduceBroadcast(), Ring()

    def choose(self, value: tf.Tensor, devices: Sequence[str]) -> AllReduce:
        """The algorithm `Auto` uses for `value` on `devices`."""
        if all(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices):
            return self._nccl
        elements = value.shape.num_elements()
        if elements is not None and elements * value.dtype.size <= self.small_bytes:
            return self._small
        return self._large

    def _sum(self, values, devices, wire_dtype):
        return self.choose(values[0], devices)(values, devices, wire_dtype=wire_dtype)


ALGORITHMS = ("auto", "collective", "nccl", "reduce_broadcast", "ring")
_SHARED = {}


def all_reduce_algorithm(algorithm: str | AllReduce) -> AllReduce:
    """The algorithm named `algorithm` (one shared instance per name), or `algorithm` itself.

    Args:
      algorithm: One of `ALGORITHMS`, or an `AllReduce` instance.

    Returns:
      An `AllReduce`.

    Raises:
      ValueError: if the name is unknown.
    """
    if isinstance(algorithm, AllReduce):
        return algorithm
    classes = {c.name: c for c in (Auto, Collective, Nccl, ReduceBroadcast, Ring)}
    if algorithm not in classes:
        raise ValueError(f"`algorithm` must be one of {ALGORITHMS}; got {algorithm!r}.")
    if algorithm not in _SHARED:
        _SHARED[algorithm] = classes[algorithm]()
    return _SHARED[algorithm]
