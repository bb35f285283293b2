"""Where the guard's own pieces run as small XLA programs in a step that is not compiled.

On a GPU each of TensorFlow's kernels is a launch of its own: the non-finite guard of an
uncompiled GPT step took 311 of them on the H200 (an `is_finite` and a reduction per gradient,
each written variable's old value copied, a select per variable: 1.06 ms of GPU time, wave
5). Its pieces are exact (a flag, a copy, a `tf.where`), so on such devices they run as a few
XLA programs per device instead, with the same values. On CPUs a kernel is a function call,
and XLA would add only its compile time: there they stay TensorFlow's kernels.
"""

from towers.ops._tensorflow import tf

PROGRAM_DEVICES = frozenset({"GPU"})  # device types whose guard pieces are XLA programs


def in_programs(device: str | None) -> bool:
    """Whether the guard's pieces on `device` run as XLA programs in an uncompiled step.

    Args:
      device: A device name, or None / "" (the placer's choice: not known, so no).
    """
    if not device:
        return False
    return (tf.DeviceSpec.from_string(device).device_type or "").upper() in PROGRAM_DEVICES
