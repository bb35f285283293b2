"""Choosing an all-reduce by the devices and the size."""

from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.gather_add import GatherAddAllReduce
from towers.ops._all_reduce.nccl import NcclAllReduce
from towers.ops._all_reduce.reduce_broadcast import ReduceBroadcastAllReduce
from towers.ops._all_reduce.ring import RingAllReduce
from towers.ops._all_reduce.terms import sends_values, terms_of
from towers.ops._tensorflow import tf


class AutoAllReduce(AllReduce):
    """Chooses by device and size: NCCL between physical GPUs, otherwise by bytes.

    NCCL needs every device to be a GPU of its own; logical GPUs split from one GPU, and
    CPUs, get the algorithms chosen by size.

    Args:
      small_bytes: Off NCCL, values up to this size go through `ReduceBroadcastAllReduce`
        (fewest ops); larger ones on two devices through `GatherAddAllReduce` (a ring's
        bytes in one hop, its additions left to the program that uses the sum), on more
        through `RingAllReduce` (spreads the additions over the devices).
    """

    name = "auto"

    def __init__(self, small_bytes: int = 64 * 1024):
        self.small_bytes = small_bytes
        self._nccl = NcclAllReduce()
        self._small, self._large = ReduceBroadcastAllReduce(), RingAllReduce()
        self._pair = GatherAddAllReduce()

    def choose(self, value: tf.Tensor, devices: Sequence[str]) -> AllReduce:
        """The algorithm `AutoAllReduce` uses for `value` on `devices`.

        Args:
          value: One of the values to reduce (its size and dtype decide, off NCCL).
          devices: The devices of the all-reduce.

        Returns:
          One of this instance's own `NcclAllReduce`, `ReduceBroadcastAllReduce`,
          `GatherAddAllReduce` or `RingAllReduce`.
        """
        if self._nccl.refusal(devices) is None:
            return self._nccl
        elements = value.shape.num_elements()
        if elements is not None and elements * value.dtype.size <= self.small_bytes:
            return self._small
        return self._pair if len(devices) == 2 else self._large

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Delegates to the algorithm `choose` picks; see `AllReduce.sum`."""
        return self.choose(values[0], devices)(values, devices, wire_dtype=wire_dtype)

    def _terms(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[list[tf.Tensor]]:
        """Delegates to the algorithm `choose` picks; see `AllReduce.sum_terms`."""
        return terms_of(self.choose(values[0], devices), values, devices, wire_dtype)

    def _sends_values(self, values: list[tf.Tensor], devices: list[str]) -> bool:
        """As the algorithm `choose` picks (`terms.sends_values`)."""
        return sends_values(self.choose(values[0], devices), values, devices)
