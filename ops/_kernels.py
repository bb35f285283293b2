"""Which kernels TensorFlow has: where the ops towers adds can run, dtype by dtype.

A GPU lacks kernels a CPU has (`SplitV` of int64, `ResourceApplyGradientDescent` of bfloat16,
...). With soft placement off (a v1 session, `tf.config.set_soft_device_placement(False)`), an
op pinned to such a GPU fails when the step first runs, far from the code that built it. Asking
TensorFlow's own kernel registry while the graph is built lets the library choose ops that run
where it puts them.
"""

import functools

from tensorflow.python.framework import kernels as _registry  # TensorFlow's kernel registry

from towers.ops._tensorflow import tf


@functools.cache
def _kernels(op_type: str) -> tuple[tuple[str, tuple[tuple[str, frozenset], ...]], ...]:
    """(device type, ((type attribute, allowed dtypes), ...)) of each kernel of `op_type`."""
    found = []
    for kernel in _registry.get_registered_kernels_for_op(op_type).kernel:
        if kernel.label:  # chosen only by an op that asks for it (`_kernel` attribute)
            continue
        constraints = tuple(
            (c.name, frozenset(c.allowed_values.list.type)) for c in kernel.constraint
        )
        found.append((kernel.device_type, constraints))
    return tuple(found)


def has_kernel(op_type: str, device: str | None, **dtypes: tf.DType) -> bool:
    """Whether TensorFlow can run `op_type` with these dtypes on `device`'s kind of device.

    Args:
      op_type: The op's type, e.g. "SplitV".
      device: A device name ("/device:GPU:1", "/job:worker/task:0/device:CPU:0"), or None or
        "" for a device TensorFlow's placer picks (then any kernel will do).
      **dtypes: The op's type attributes, e.g. `T=tf.int64`.

    Returns:
      Whether a kernel of that device type (or a device-agnostic one, for devices other than
      CPUs) accepts every dtype given.
    """
    kind = tf.DeviceSpec.from_string(device).device_type if device else None
    wanted = {name: tf.as_dtype(dtype).as_datatype_enum for name, dtype in dtypes.items()}
    for device_type, constraints in _kernels(op_type):
        if kind is not None and device_type not in (kind, "DEFAULT" if kind != "CPU" else kind):
            continue
        allowed = dict(constraints)
        if all(name not in allowed or enum in allowed[name] for name, enum in wanted.items()):
            return True
    return False
