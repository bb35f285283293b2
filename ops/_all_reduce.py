"""All-reduce algorithms sharing one contract: K values on K devices in, K sums out."""

import itertools
from collections.abc import Sequence

from ops._tensorflow import tf

REDUCTIONS = ("sum", "mean")
WIRE_DTYPES = (None, tf.float16, tf.bfloat16)


class AllReduce:
    """Base of the algorithms: validation, K=1, mean and transfer dtype are handled here.

    Call an algorithm as `algorithm(values, devices, reduction="sum", wire_dtype=None)`:
    `values[i]` lives on `devices[i]`; the result is K tensors, result i on `devices[i]`, all
    equal to the sum (or mean) of the values. With `wire_dtype` (float16 or bfloat16) values
    cross devices in that dtype; the plain-op algorithms accumulate in the values' dtype.
    """

    name = "base"

    def __call__(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """All-reduces `values`; see the class docstring.

        Raises:
          ValueError: if values and devices differ in number, values differ in shape or
            dtype, or `reduction` or `wire_dtype` is unknown.
        """
        values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
        _check(values, devices, reduction, wire_dtype)
        if len(values) == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        summed = self._sum(values, devices, wire_dtype)
        if reduction == "sum":
            return summed
        out = []
        for value, device in zip(summed, devices):
            with tf.device(device):
                out.append(value / tf.cast(len(values), value.dtype))
        return out

    def _sum(self, values: list, devices: list, wire_dtype) -> list:
        raise NotImplementedError


def _check(values: list, devices: list, reduction: str, wire_dtype) -> None:
    if not values or len(values) != len(devices):
        raise ValueError(
            f"All-reduce needs one value per device; got {len(values)} values and "
            f"{len(devices)} devices."
        )
    first = values[0]
    for i, value in enumerate(values[1:], start=1):
        if value.dtype != first.dtype or not value.shape.is_compatible_with(first.shape):
            raise ValueError(
                f"All-reduced values must agree in shape and dtype; value 0 is "
                f"{first.dtype.name}{first.shape} and value {i} is {value.dtype.name}{value.shape}."
            )
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}; got {reduction!r}.")
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(
            f"`wire_dtype` must be None, tf.float16 or tf.bfloat16; got {wire_dtype!r}."
        )


def _to_wire(value: tf.Tensor, wire_dtype) -> tf.Tensor:
    return value if wire_dtype is None else tf.cast(value, wire_dtype)


class ReduceBroadcast(AllReduce):
    """Sums every value on one device (default the first), then copies the sum to each device.

    Args:
      reduce_device: Where to sum; None for the first value's device.
    """

    name = "reduce_broadcast"

    def __init__(self, reduce_device: str | None = None):
        self.reduce_device = reduce_device

    def _sum(self, values, devices, wire_dtype):
        dtype = values[0].dtype
        sent = []
        for value, device in zip(values, devices):
            with tf.device(device):
                sent.append(_to_wire(value, wire_dtype))
        with tf.device(self.reduce_device or devices[0]):
            total = _to_wire(tf.add_n([tf.cast(v, dtype) for v in sent]), wire_dtype)
        out = []
        for device in devices:
            with tf.device(device):
                out.append(tf.cast(tf.identity(total), dtype))
        return out


class Ring(AllReduce):
    """Reduce-scatter then all-gather over K chunks, made of plain ops.

    Chunk c is summed hop by hop around the ring and ends on device c; then every device
    gathers all K chunk sums. Each device sends about 2 (K-1)/K of the data, and every chunk
    sum is computed once, so all results are bitwise identical.
    """

    name = "ring"

    def _sum(self, values, devices, wire_dtype):
        k, dtype, shape = len(values), values[0].dtype, values[0].shape
        if not shape.is_fully_defined():
            with tf.device(devices[0]):
                shape = tf.shape(values[0])
        chunks = []
        for value, device in zip(values, devices):
            with tf.device(device):
                flat = tf.reshape(value, [-1])
                n = tf.size(flat)
                sizes = n // k + tf.cast(tf.range(k) < n % k, n.dtype)
                chunks.append(tf.split(flat, sizes, num=k))
        sums = []
        for c in range(k):
            first = (c + 1) % k
            with tf.device(devices[first]):
                acc = _to_wire(chunks[first][c], wire_dtype)
            for hop in range(2, k + 1):
                d = (c + hop) % k
                with tf.device(devices[d]):
                    acc = _to_wire(tf.cast(acc, dtype) + chunks[d][c], wire_dtype)
            sums.append(acc)
        out = []
        for device in devices:
            with tf.device(device):
                gathered = tf.concat([tf.cast(tf.identity(s), dtype) for s in sums], axis=0)
                out.append(tf.reshape(gathered, shape))
        return out


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
    _group_keys = itertools.count(1)  # group keys must be unique in the process

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
        group = self._groups.setdefault(tuple(devices), next(Collective._group_keys))
        instance = next(self._instance_keys)
        out = []
        for value, device in zip(values, devices):
            with tf.device(device):
                summed = tf.raw_ops.CollectiveReduceV2(
                    input=_to_wire(value, wire_dtype),
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
                    input=_to_wire(value, wire_dtype),
                    reduction="sum",
                    num_devices=len(devices),
                    shared_name=shared_name,
                )
                out.append(tf.cast(summed, value.dtype))
        return out


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
