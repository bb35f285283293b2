"""The all-reduce contract's argument checks: what every algorithm refuses, and where."""

from collections.abc import Sequence

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


def check(values: list, devices: list, reduction: str, wire_dtype, *, shapes: bool = True) -> None:
    """Refuses values the contract cannot add (and, with `shapes`, values of other shapes).

    Raises:
      ValueError: for a mismatch of values and devices, dtypes or shapes, or an option.
      TypeError: for values that are not numbers, or that a GPU cannot add.
    """
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
        same_shape = not shapes or value.shape.is_compatible_with(first.shape)
        if value.dtype != first.dtype or not same_shape:
            raise ValueError(
                f"All-reduced values must agree in shape and dtype; value 0 is "
                f"{first.dtype.name}{first.shape} and value {i} is {value.dtype.name}{value.shape}."
            )
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` must be one of {REDUCTIONS}; got {reduction!r}.")
    check_wire_dtype(wire_dtype)


def same_shapes_at_run_time(values: list, devices: list) -> list:
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


def checked(values: Sequence, devices: Sequence, reduction: str, wire_dtype) -> tuple:
    """`values` as checked tensors (shapes also when the step runs), `devices` as a list."""
    values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
    check(values, devices, reduction, wire_dtype)
    return same_shapes_at_run_time(values, devices), devices
