"""The all-reduce contract: K values on K devices in, K equal sums (or means) out."""

import abc
from collections.abc import Sequence

from towers.ops._autograph import library_code
from towers.ops._device_scope import host_scope
from towers.ops._tensorflow import tf

REDUCTIONS = ("sum", "mean")
# What TensorFlow's AddN adds on a GPU (int32 in host memory).
_ADDED_ON_GPUS = (
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.complex64,
    tf.complex128,
    tf.int32,
    tf.int64,
    tf.uint32,
)
WIRE_DTYPES = (None, tf.float16, tf.bfloat16)


class AllReduce(abc.ABC):
    """Base of every all-reduce algorithm: one call contract, one method to implement.

    Call an algorithm as `algorithm(values, devices, reduction="sum", wire_dtype=None)`:
    `values[i]` lives on `devices[i]`; the result is K tensors, result i on `devices[i]`, all
    equal to the sum (or mean) of the values. With `wire_dtype` (float16 or bfloat16) values
    cross devices in that dtype. The base class validates the arguments, handles K=1 and the
    mean; an algorithm implements only `sum`.

    A custom algorithm subclasses `AllReduce` and implements `sum`; it can then be given
    anywhere an algorithm is accepted (`ops.all_reduce_gradients(algorithm=...)`,
    `towers.Replicated(all_reduce=...)`):

        class AddEverywhere(ops.AllReduce):
            name = "add_everywhere"

            def sum(self, values, devices, wire_dtype):
                out = []
                for device in devices:
                    with tf.device(device):
                        out.append(tf.add_n([tf.identity(v) for v in values]))
                return out

    Attributes:
      name: The algorithm's name, as in `ops.ALGORITHMS` for the built-in ones.
    """

    name = "base"

    @library_code
    def __call__(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """All-reduces `values`; see the class docstring.

        Args:
          values: K tensors of one shape and dtype, `values[i]` on `devices[i]`.
          devices: The K devices.
          reduction: "sum" or "mean".
          wire_dtype: None, tf.float16 or tf.bfloat16: the dtype values cross devices in.

        Returns:
          K tensors, result i built on `devices[i]`.

        Raises:
          ValueError: if values and devices differ in number, values differ in static shape
            or dtype, or `reduction` or `wire_dtype` is unknown, or `wire_dtype` is given for
            values that are not floating-point.
          TypeError: for values that are not numbers (strings, booleans), or the mean of
            integers (inexact: sum them, and divide as floats).
          tf.errors.InvalidArgumentError: when the step runs, if shapes known only then
            differ.
        """
        values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
        _check(values, devices, reduction, wire_dtype)
        values = _same_shapes_at_run_time(values, devices)
        if self.group_size(len(values)) == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        summed = self.sum(values, devices, wire_dtype)
        if reduction == "sum":
            return summed
        out = []
        for value, device in zip(summed, devices):
            with tf.device(device):
                out.append(value / tf.cast(self.group_size(len(values)), value.dtype))
        return out

    def group_size(self, num_values: int) -> int:
        """How many values one all-reduce of `num_values` local values adds up.

        `num_values` itself, unless the group reaches beyond this process's devices (another
        process's towers): the mean divides by it, and a group of one is its own sum.

        Args:
          num_values: The number of values given, one per device.

        Returns:
          The number of values in the sum.
        """
        return num_values

    @abc.abstractmethod
    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """The extension point: returns the sum of `values` on each of `devices`.

        Called by `__call__` after validation, with K >= 2 values of one shape and dtype,
        `values[i]` on `devices[i]`.

        Args:
          values: The K tensors to add.
          devices: Their K devices.
          wire_dtype: None, or the dtype (float16 or bfloat16) to cast values to before they
            cross devices; cast results back to the values' dtype.

        Returns:
          K tensors of the values' shape and dtype, tensor i built on `devices[i]`. They must
          be bitwise equal (compute each sum once and copy it, or add in the same order on
          every device) so that replicated variables updated with them stay identical.
        """


def _check(values: list, devices: list, reduction: str, wire_dtype) -> None:
    if not values or len(values) != len(devices):
        raise ValueError(
            f"All-reduce needs one value per device; got {len(values)} values and "
            f"{len(devices)} devices."
        )
    first = values[0]
    if not (first.dtype.is_floating or first.dtype.is_integer or first.dtype.is_complex):
        raise TypeError(f"All-reduce adds numbers; got {first.dtype.name} values.")
    if on_gpus(devices) and first.dtype not in _ADDED_ON_GPUS:
        raise TypeError(
            f"TensorFlow has no GPU kernel that adds {first.dtype.name} values (AddN); cast "
            "them to int32 or int64 first."
        )
    if reduction == "mean" and first.dtype.is_integer:
        raise TypeError(
            f"The mean of {first.dtype.name} values is not an integer in general; all-reduce "
            "with reduction='sum' and divide as floats, or cast the values to a float first."
        )
    if wire_dtype is not None and not first.dtype.is_floating:
        raise ValueError(
            f"`wire_dtype` sends floating-point values in fewer bits; {first.dtype.name} "
            "values would lose their value. Pass wire_dtype=None for them."
        )
    for i, value in enumerate(values[1:], start=1):
        if value.dtype != first.dtype or not value.shape.is_compatible_with(first.shape):
            raise ValueError(
                f"All-reduced values must agree in shape and dtype; value 0 is "
                f"{first.dtype.name}{first.shape} and value {i} is {value.dtype.name}{value.shape}."
            )
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}; got {reduction!r}.")
    check_wire_dtype(wire_dtype)


def _same_shapes_at_run_time(values: list, devices: list) -> list:
    """`values`, waiting for a check that their shapes agree where not all are static.

    An algorithm splitting values into chunks by their own sizes would mix values of
    different shapes silently.
    """
    if all(v.shape.is_fully_defined() for v in values):
        return values
    with host_scope():
        checks = [
            tf.debugging.assert_equal(
                tf.shape(v, out_type=tf.int64),
                tf.shape(values[0], out_type=tf.int64),
                message=f"All-reduced values must agree in shape: value {i} and value 0 differ",
            )
            for i, v in enumerate(values[1:], start=1)
        ]
    out = []
    for value, device in zip(values, devices):
        with tf.device(device), tf.control_dependencies(checks):
            out.append(tf.identity(value))
    return out


def on_gpus(devices: Sequence[str]) -> bool:
    """Whether any of `devices` is a GPU."""
    return any(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices)


def check_wire_dtype(wire_dtype: tf.DType | None) -> None:
    """Refuses a transfer dtype other than None, float16 and bfloat16 (a `ValueError`)."""
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(
            f"`wire_dtype` must be None, tf.float16 or tf.bfloat16; got {wire_dtype!r}."
        )


def to_wire(value: tf.Tensor, wire_dtype: tf.DType | None) -> tf.Tensor:
    """`value` cast to the transfer dtype, or unchanged without one."""
    return value if wire_dtype is None else tf.cast(value, wire_dtype)


def sum_on(
    device: str, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
) -> tf.Tensor:
    """The sum of `values` (value i on `devices[i]`), built on `device`.

    Values leave their devices in `wire_dtype` and are added in their own dtype.
    """
    dtype = values[0].dtype
    sent = []
    for value, source in zip(values, devices):
        with tf.device(source):
            sent.append(to_wire(value, wire_dtype))
    with tf.device(device):
        return tf.add_n([tf.cast(v, dtype) for v in sent])


def spread(
    total: tf.Tensor, source: str, devices: list[str], dtype: tf.DType, wire_dtype: tf.DType | None
) -> list[tf.Tensor]:
    """`total` (on `source`) copied to each of `devices`, sent in `wire_dtype`, as `dtype`.

    Every copy is the same cast of the same sent tensor: bitwise equal everywhere.
    """
    with tf.device(source):
        sent = to_wire(total, wire_dtype)
    out = []
    for device in devices:
        with tf.device(device):
            out.append(tf.cast(tf.identity(sent), dtype))
    return out
