"""All-reduce by copying both values to both devices and adding them there."""

from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.transfers import spread, sum_on, to_wire
from towers.ops._tensorflow import tf


class GatherAddAllReduce(AllReduce):
    """Two devices: each receives the other's value and adds the two, in the values' order.

    Each device moves the whole other value: the bytes of a ring of two, in one hop instead
    of two, and where a compiled program uses the sum its addition needs no pass of its own
    (`sum_terms`: a compiled update adds the two values as it reads them). One addition of
    the same two values gives the same bits on both devices. `"auto"` takes it for large
    values on two devices that share no NCCL.

    For more than two devices it sums once, on the first, and copies the sum back (as
    `ReduceBroadcastAllReduce`): TensorFlow merges a chain of additions into one `AddN`,
    which on the H200 came out an ulp apart on one device of three (or four) for the same
    values in the same order.
    """

    name = "gather_add"

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Each device's terms added there; see `AllReduce.sum`."""
        if len(values) > 2:
            total = sum_on(devices[0], values, devices, wire_dtype)
            return spread(total, devices[0], devices, values[0].dtype, wire_dtype)
        out = []
        for device, terms in zip(devices, self._terms(values, devices, wire_dtype)):
            with tf.device(device):
                out.append(added(terms))
        return out

    def _sends_values(self, values: list[tf.Tensor], devices: list[str]) -> bool:
        """Two values are sent as they are (`terms.sends_values`); more are summed first."""
        return len(values) == 2

    def _terms(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[list[tf.Tensor]]:
        """Both values on each device (its own as the other receives it), or the sums."""
        if len(values) > 2:
            return [[total] for total in self.sum(values, devices, wire_dtype)]
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
    """One term as it is, or two added: the same bits on every device that adds them.

    `sum_terms` gives at most two: more, added outside XLA, may round apart across GPUs.
    """
    if len(terms) > 2:
        raise ValueError(f"A device's sum has at most two terms; got {len(terms)}.")
    return terms[0] if len(terms) == 1 else tf.add(terms[0], terms[1])
