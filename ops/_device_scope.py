"""Device scopes, and whether a placement is on a device.

One scope keeps the caller's when no device is given; one is for host-only ops.
"""

import contextlib

from towers.ops._tensorflow import tf


def device_scope(device: str | None) -> contextlib.AbstractContextManager:
    """`tf.device(device)`, or no scope at all for None or "".

    `tf.device(None)` would clear the caller's device scope in a graph; here None means "keep
    whatever the caller chose".
    """
    return tf.device(device) if device else contextlib.nullcontext()


def host_scope() -> contextlib.AbstractContextManager:
    """The CPU beside the device in scope: for ops that have no GPU kernel (string tensors).

    (And for the checks: an `Assert` has a kernel on every device, reading its inputs from
    host memory, but the checks' messages are strings, and the non-finite check stays on
    the host so that its error comes alone: `towers.step._nonfinite.checked_loss`.)

    The scope merges with the caller's, so inside `tf.device("/job:w/task:1/device:GPU:2")`
    ops go to `/job:w/task:1/device:CPU:0`, the host of that GPU. Without it such an op built
    under a GPU's scope fails to place wherever soft placement is off (a v1 session, or
    `tf.config.set_soft_device_placement(False)`).
    """
    return tf.device("/device:CPU:0")


def holds(device: str, placed: str) -> bool:
    """Whether something placed on `placed` lives on `device` (which may omit the job).

    The same device type and index; job, replica and task the same where `device` names them.
    Unplaced ("") is on no device.
    """
    want, got = tf.DeviceSpec.from_string(device), tf.DeviceSpec.from_string(placed)
    same = (want.device_type, want.device_index) == (got.device_type, got.device_index)
    return same and _same_task(want, got)


def in_task(device: str | None, placed: str) -> bool:
    """Whether `placed` is in the task of `device`.

    Job, replica and task the same where `device` names them; a name without them (or None)
    is in every task.
    """
    return _same_task(tf.DeviceSpec.from_string(device or ""), tf.DeviceSpec.from_string(placed))


def _same_task(want: tf.DeviceSpec, got: tf.DeviceSpec) -> bool:
    return all(getattr(want, part) in (None, getattr(got, part)) for part in _TASK)


_TASK = ("job", "replica", "task")
