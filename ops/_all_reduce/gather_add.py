"""All-reduce by copying every value to every device and adding them there, in one order."""

import functools
from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.transfers import to_wire
from towers.ops._tensorflow import tf


class GatherAddAllReduce(AllReduce):
    """Every device receives every value and adds them, in the values' order.

    Each device moves the whole of each other value (K - 1 copies in, where a ring moves
    2 (K - 1) / K): the same bytes as a ring for two devices, in one hop instead of two, and
    its additions need no pass of their own where a compiled program uses the sum
    (`sum_terms`: a compiled update adds the terms as it reads them). Every device adds the
    same values in the same order: the same bits everywhere. `"auto"` takes it for large
    values on two devices that share no NCCL.
    """

    name = "gather_add"

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Each device's terms added there; see `AllReduce.sum`."""
        out = []
        for device, terms in zip(devices, self._terms(values, devices, wire_dtype)):
            with tf.device(device):
                out.append(added(terms))
        return out

    def _terms(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[list[tf.Tensor]]:
        """Every value on every device (each device's own as the others receive it)."""
        dtype = values[0].dtype
        sent = []
        for value, source in zip(values, devices):
            with tf.device(source):
                sent.append(to_wire(value, wire_dtype))
        out = []
        for device in devices:
            with tf.device(device):
                out.append(
                    [
                        value if wire_dtype is None and source == device else tf.identity(value)
                        for value, source in zip(sent, devices)
                    ]
                )
                out[-1] = [tf.cast(v, dtype) for v in out[-1]]
        return out


def added(terms: Sequence[tf.Tensor]) -> tf.Tensor:
    """`((t0 + t1) + t2) + ...`: one association on every device, so the same bits.

    Not `tf.add_n`: on the H200 a float32 `AddN` of the same three values came out an ulp
    apart on one of three devices (why, we did not study; its kernel may reuse an input's
    buffer and add in another order).
    """
    return functools.reduce(tf.add, terms)
