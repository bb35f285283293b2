"""Where an uncompiled step's update and the guard's pieces run as XLA programs.

On a GPU each of TensorFlow's kernels is a launch of its own: the non-finite guard of an
uncompiled GPT step took 311 of them on the H200 (an `is_finite` and a reduction per gradient,
each written variable's old value copied, a select per variable: 1.06 ms of GPU time, wave
5). On such devices a towers rule's update is one XLA program per device even in an
uncompiled step, the guard's choice (and, where it can, its check) inside
(`towers.optimizers._device_updates`); the guard's pieces beside what stays TensorFlow's
kernels (a copy, a `tf.where`, the check) are a few programs per device, with the same values.
On CPUs a kernel is a function call, and XLA would add only its compile time: there they stay
TensorFlow's kernels.
"""

from towers.ops._tensorflow import tf

PROGRAM_DEVICES = frozenset({"GPU"})  # device types whose guard pieces are XLA programs


def in_programs(device: str | None) -> bool:
    """Whether an uncompiled step's update and guard on `device` run as XLA programs.

    Args:
      device: A device name, or None / "" (the placer's choice: not known, so no).
    """
    if not device:
        return False
    return (tf.DeviceSpec.from_string(device).device_type or "").upper() in PROGRAM_DEVICES
