"""Each device checks the buckets it sends, and its flags cross with them.

With `gather_add` on two devices, each device receives the other's bucket, and a compiled
update adds the two as it reads them (`towers.ops._packed_sum`). The guard's check of the
sum, in that update, reads both buckets: every gradient's bytes twice on each device (on the
H100, 0.2 ms per device of a GPT's 29 ms step at K=2, the bandwidth's time for 0.65 GB).
Here each device checks only the bucket it made, in one XLA program beside the transfer, and
its flags travel with the bucket: each device reads its gradients once, and the update
decides from the two flag vectors.

A term's value passes when twice it is finite (at most half the dtype's largest): two such
terms add without overflowing, and the sum, multiplied by a weight of at most one, stays
finite. So the update still never writes a non-finite value. The price is one corner: a
term above half the dtype's largest value (1.7e38 in float32) counts as not finite, even
where the other term would have brought the sum back into range.
"""

import dataclasses
from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.terms import sends_values
from towers.ops._finite import LAID_LIMIT, laid_flags, laid_pairs
from towers.ops._packing import PackSpec
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import accumulation_dtype


def crossing(
    values: Sequence[tf.Tensor],
    devices: Sequence[str],
    algorithm: AllReduce,
    wire: tf.DType | None,
    factor: float | None,
    divided: bool,
) -> bool:
    """Whether a bucket's terms are its two values themselves, as made (see the module).

    Their sum stays in range where each term passes: no division after it (`divided`, by
    the weights' total), and a weight (`factor`) of at most one.
    """
    return (
        not divided
        and abs(factor or 0.0) <= 1
        and len(values) == 2
        and wire is None
        and algorithm.group_size(2) == 2  # (no other process's towers in the sum)
        and sends_values(algorithm, list(values), devices)
    )


@dataclasses.dataclass(eq=False)
class Crossing:
    """Two devices' buckets whose terms cross, their flags built when an update asks.

    Built lazily (`flags_on`), by the first compiled update that judges its copy from them:
    a step that checks its sums otherwise (a hook, accumulated sums) builds nothing here.

    Attributes:
      packed: Per device, its buckets (the terms it sends, weighted as they are summed).
      spec: How the gradients were packed.
      devices: The two devices.
      chosen: The buckets whose terms are the two values (`crossing`).
    """

    packed: Sequence[Sequence[tf.Tensor]]
    spec: PackSpec
    devices: Sequence[str]
    chosen: list[int]
    _made: list | None = None
    _sent: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        packed: Sequence[Sequence[tf.Tensor]],
        spec: PackSpec,
        devices: Sequence[str],
        crosses: Sequence[bool],
    ) -> "Crossing | None":
        """The crossing of the buckets where `crosses`, or None where none can.

        None in eager mode (each call would compile the check again), where no bucket
        crosses, and where `laid_flags` would compare too many pairs (`laid_pairs`).
        """
        if tf.executing_eagerly() or not any(crosses) or laid_pairs(spec.sizes) > LAID_LIMIT:
            return None
        return cls(packed, spec, devices, [b for b, ok in enumerate(crosses) if ok])

    def flags_on(self, i: int) -> list[list[tf.Tensor] | None]:
        """Device i's flags: for each bucket, one flag vector per term, on device i.

        None for a bucket whose sum is checked itself. The first call builds each device's
        check of its own buckets (one XLA program per device).
        """
        made = self._built()
        if i not in self._sent:
            mine: list[list[tf.Tensor] | None] = [None] * len(self.spec.buckets)
            with tf.device(self.devices[i]):
                for n, b in enumerate(self.chosen):
                    mine[b] = [
                        flags[n] if j == i else tf.identity(flags[n])
                        for j, flags in enumerate(made)
                    ]
            self._sent[i] = mine
        return self._sent[i]

    def flags_made(self) -> list[list[tf.Tensor] | None]:
        """As `flags_on`, each term's flags where its device made them (nothing crosses).

        For a reader beside the devices (the host's check of "raise"): the same booleans
        each update reads, before the buckets reach it.
        """
        made = self._built()
        out: list[list[tf.Tensor] | None] = [None] * len(self.spec.buckets)
        for n, b in enumerate(self.chosen):
            out[b] = [flags[n] for flags in made]
        return out

    def _built(self) -> list:
        """Each device's flags of its chosen buckets, its check built on the first call."""
        if self._made is None:  # each device checks its own buckets, in one program
            every = self.spec.sizes
            sizes = [every[b] for b in self.chosen]

            def crossed_flags(buckets: list[tf.Tensor]) -> list[tf.Tensor]:
                return laid_flags([_doubled(bucket) for bucket in buckets], sizes)

            program = tf.function(crossed_flags, jit_compile=True, autograph=False)
            self._made = []
            for buckets, device in zip(self.packed, self.devices):
                with tf.device(device), tf.name_scope("crossed_flags"):
                    self._made.append(program([buckets[b] for b in self.chosen]))
        return self._made


def _doubled(bucket: tf.Tensor) -> tf.Tensor:
    """Twice the bucket, in the dtype it is added in: finite where two such terms add."""
    wide = tf.cast(bucket, accumulation_dtype(bucket.dtype))
    return wide + wide
