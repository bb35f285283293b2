"""TensorFlow's collective all-reduce (`CollectiveReduceV2`), ordered per device."""

import functools
import itertools

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.checks import on_gpus
from towers.ops._all_reduce.transfers import to_wire
from towers.ops._arguments import check_int, check_number
from towers.ops._collectives import ALL_REDUCE, random_group_key, reduce_on
from towers.ops._tensorflow import tf

# What CollectiveReduceV2 has kernels for.
_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


class CollectiveAllReduce(AllReduce):
    """TensorFlow's collective all-reduce (`CollectiveReduceV2`; NCCL on GPUs).

    Each device's collectives are ordered by a per-device token, as TensorFlow's own
    `CollectiveAllReduce` does: without that order the ops of one function may start in
    different orders on different devices and wait for each other forever. The token is a
    resource handle kept by the function graph being built, one per device, shared by every
    instance that builds collectives in that function, so `tf.function`'s automatic control
    dependencies chain all of a device's collectives; no variable is created, and an
    instance may be made inside a function. In a v1 graph, which has no automatic ordering,
    each collective waits (a control dependency) for the previous one on its device built
    in the same `collective_order()` block (`all_reduce_gradients` opens one per call), or
    in the whole graph outside such blocks. Eagerly it is refused: each op would wait alone
    for its peers. With `wire_dtype` the sum itself runs in that dtype.

    Every instance owns its keys: its group keys (one per device set) and its instance keys
    (one per all-reduce it builds); two models in one process never mix their collectives.
    Group keys are process-wide in TensorFlow's runtime; an instance draws each at random
    from [2**20, 2**31) (the range `towers.ops` keeps for it; see `ops.internal`) unless
    `group_key` fixes it. Collectives that must meet another process's (several workers) need
    keys that agree: pass the same `group_key` there.

    A timeout makes each collective slower in TensorFlow 2.21 (about 0.5 ms per small
    all-reduce between local devices, 2 ms between processes, measured on loopback; 5-10%
    of a step at 8 towers), and guards only against a program whose devices build
    different collectives: one process can lose no peer. So by default a `tf.function`,
    which runs every device's collectives or none, gets none, and a v1 graph, where a
    session that fetches some devices' results only would wait for ever, gets 120 s.

    Args:
      timeout_seconds: How long a collective may wait for its peers before failing; 0 to
        wait for ever, in functions and v1 graphs alike; None (the default) for no timeout
        in `tf.function` and `v1_timeout_seconds` in a v1 graph.
      group_key: The group key of the first device set this instance reduces over (the next
        sets get `group_key + 1`, ...), in [2**20, 2**31); None to draw keys at random.

    Raises:
      ValueError: if `timeout_seconds` is negative or `group_key` is out of range.
    """

    name = "collective"
    v1_timeout_seconds = 120.0  # a v1 graph's timeout when `timeout_seconds` is None

    def __init__(self, timeout_seconds: float | None = None, *, group_key: int | None = None):
        timeout_seconds = check_number(timeout_seconds, "timeout_seconds", minimum=0, none=True)
        # Below 2**20, keys are tf.distribute's and towers' own (see ops.internal).
        group_key = check_int(
            group_key, "group_key", minimum=ALL_REDUCE.start, maximum=ALL_REDUCE.stop - 1, none=True
        )
        self.timeout_seconds = timeout_seconds
        self._first_group_key = group_key
        self._groups: dict[tuple[str, ...], int] = {}
        self._instance_keys = itertools.count(1)

    def group_key(self, devices: list[str]) -> int:
        """The group key this instance uses for `devices` (drawn on first use).

        Args:
          devices: The devices of one all-reduce, in order.

        Returns:
          The key, an int.
        """
        members = tuple(devices)
        if members not in self._groups:
            if self._first_group_key is not None:
                self._groups[members] = self._first_group_key + len(self._groups)
            else:
                self._groups[members] = random_group_key(ALL_REDUCE)
        return self._groups[members]

    def keys(self, value: tf.Tensor, devices: list[str]) -> tuple[int, int, int]:
        """(group size, group key, instance key) of the next all-reduce of `value`s.

        The extension point of collectives whose group reaches beyond `devices`.

        Args:
          value: The first device's value (its shape and dtype are the others').
          devices: This process's devices of the all-reduce.

        Returns:
          The three keys of `CollectiveReduceV2`.
        """
        del value
        return self.group_size(len(devices)), self.group_key(devices), next(self._instance_keys)

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """One `CollectiveReduceV2` per device; see `AllReduce.sum`.

        The sum is differentiable: each device's gradient is the sum of every device's
        upstream gradient, by another collective, so every device's result must reach the
        loss (as each tower's does in a step); one that does not leaves the others' backward
        collective waiting for it (until `timeout_seconds`, if set).

        Raises:
          ValueError: eagerly, or if a device repeats.
          TypeError: for a dtype `CollectiveReduceV2` does not add (int8, uint8, ...).
        """
        if tf.executing_eagerly():
            raise ValueError(
                f"The {self.name!r} all-reduce must be built inside tf.function (or a v1 "
                "graph): wrap the step in @tf.function; eagerly each collective would wait "
                "alone for its peers."
            )
        if values[0].dtype not in _DTYPES:
            raise TypeError(
                f"The {self.name!r} all-reduce (TensorFlow's CollectiveReduceV2) adds "
                f"{', '.join(d.name for d in _DTYPES)}; got {values[0].dtype.name} values. Use "
                "'ring' or 'reduce_broadcast' for them."
            )
        if values[0].dtype == tf.int32 and on_gpus(devices):
            raise TypeError(
                f"The {self.name!r} all-reduce does not add int32 on GPUs (TensorFlow keeps "
                "int32 in host memory there); cast to int64, or use 'ring'."
            )
        if len(set(devices)) != len(devices):
            raise ValueError(
                f"The {self.name!r} all-reduce needs distinct devices, one value each; got "
                f"{devices}. Reduce values of one device first, or use 'ring'."
            )
        size, group, forward = self.keys(values[0], devices)
        timeout = self.timeout()
        drawn: list[int] = []  # the instance key of each gradient taken, drawn by the first

        def backward(n: int) -> int:  # the n-th gradient a device takes of this sum
            while len(drawn) <= n:
                drawn.append(self.keys(values[0], devices)[2])
            return drawn[n]

        def reduce(value, device, instance):
            summed = reduce_on(device, to_wire(value, wire_dtype), size, group, instance, timeout)
            with tf.device(device):
                return tf.cast(summed, value.dtype)

        out = []
        for value, device in zip(values, devices):
            with tf.device(device):
                out.append(
                    _differentiable(
                        functools.partial(reduce, device=device), value, forward, backward
                    )
                )
        return out

    def timeout(self) -> float:
        """The timeout of the collectives being built, in seconds; 0 for none.

        Returns:
          `timeout_seconds`; when None, 0 inside `tf.function` and `v1_timeout_seconds`
          in a v1 graph.
        """
        if self.timeout_seconds is not None:
            return self.timeout_seconds
        in_function = tf.compat.v1.executing_eagerly_outside_functions()
        return 0.0 if in_function else self.v1_timeout_seconds


def _differentiable(reduce, value: tf.Tensor, forward: int, backward) -> tf.Tensor:
    """`reduce(value, forward)`, whose n-th gradient is `reduce(upstream, backward(n))`.

    The gradient of a sum over devices, for each device, is the sum of the upstream gradients
    of every device's result: the same all-reduce, keyed apart (each gradient taken of it
    once more). TensorFlow registers none for `CollectiveReduceV2`.
    """
    if not value.dtype.is_floating:
        return reduce(value, instance=forward)
    taken = itertools.count()

    @tf.custom_gradient
    def summed(x):
        def grad(upstream):
            return reduce(upstream, instance=backward(next(taken)))

        return reduce(x, instance=forward), grad

    return summed(value)
