"""Writes kept or undone on the device: a boolean chooses between a variable's new and old value.

A step whose verdict arrives on a device (a GPU's `is_finite` of its gradients) must not make
the host wait for it: a `tf.cond` on such a flag copies it to the host and stalls every update
behind it, in TensorFlow's executor and in XLA alike. Here every write happens, and then each
written variable takes `tf.where(keep, new, old)`: a skipped step is a step that wrote the old
values. (A select, not a product: NaN times 0 is NaN.) Inside an XLA program the read, the
update and the select fuse into one pass over each variable; outside one, on a GPU, the old
values' copies and the choices are an XLA program each per device (`programs`).
"""

from collections.abc import Callable, Sequence
from typing import Any

from towers.ops._programs import in_programs
from towers.ops._tensorflow import tf
from towers.ops._updates import update_ops


def selected(
    keep: tf.Tensor | None,
    variables: Sequence[tf.Variable],
    build: Callable[[], Any],
    *,
    programs: bool = False,
) -> list:
    """Builds `build()`, which writes `variables` in place, then keeps its writes only where `keep`.

    Each variable is read before `build()` runs and assigned `tf.where(keep, new, old)` after
    it, on its own device, so that with `keep` False every variable ends as it began. The
    update may write them in any way (fused kernels, scatters, assigns).

    Args:
      keep: A boolean scalar (on any device; no host reads it), or None to build `build()`
        as it is.
      variables: Every variable `build()` writes. A variable it writes and that is not
        listed keeps the write.
      build: Builds the writes; returns update ops (nested), or None.
      programs: Outside an XLA program: on devices where each kernel is a launch of its own
        (`towers.ops._programs.in_programs`: GPUs), copy the old values of each device's
        floating-point variables in one XLA program and choose in another, not a read and a
        select (and a copy before each in-place write) per variable. The same values.

    Returns:
      The ops to run (or wait for): the writes and the choices after them.
    """
    if keep is None:
        return update_ops(build())
    groups: dict[tuple[str, bool], list[tf.Variable]] = {}
    for var in _unique(variables):
        programmed = programs and var.dtype.is_floating and in_programs(var.device)
        groups.setdefault((var.device, programmed), []).append(var)
    old = []
    for (device, programmed), group in groups.items():
        with tf.device(device):
            old.append(_copied(group) if programmed else [_read(var) for var in group])
    with tf.control_dependencies([t for values in old for t in values]):  # (v1: no auto order)
        writes = update_ops(build())
    chosen = []
    with tf.control_dependencies(writes):
        for ((device, programmed), group), before in zip(groups.items(), old):
            with tf.device(device):
                if programmed:
                    chosen.append(_chosen(keep, group, before))
                    continue
                for var, value in zip(group, before):
                    new = tf.where(keep, _read(var), value)
                    chosen.append(var.assign(new, read_value=False))
    return writes + update_ops(chosen)


def _copied(variables: list[tf.Variable]) -> list[tf.Tensor]:
    """The variables' values, copied by one XLA program.

    Their buffers are not shared, so the writes after it need no copy before writing in place.
    """

    def old_values() -> list[tf.Tensor]:
        return [var.read_value() for var in variables]

    return tf.function(old_values, jit_compile=True, autograph=False)()


def _chosen(keep: tf.Tensor, variables: list[tf.Variable], old: list[tf.Tensor]) -> tf.Tensor:
    """Each variable assigned `tf.where(keep, its value, old)`, in one XLA program."""

    def kept_writes(keep: tf.Tensor, old: list[tf.Tensor]) -> tf.Tensor:
        for var, value in zip(variables, old):
            var.assign(tf.where(keep, var.read_value(), value), read_value=False)
        return tf.constant(True)  # the program's output; its writes are its effect

    return tf.function(kept_writes, jit_compile=True, autograph=False)(keep, old)


def _read(var: tf.Variable) -> tf.Tensor:
    """The variable's value now, as one op.

    (`read_value` adds an identity; `value` may give a copy cached before the writes.)
    """
    return tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype)


def _unique(variables: Sequence[tf.Variable]) -> list[tf.Variable]:
    seen, out = set(), []
    for var in variables:
        if var.ref() not in seen:
            seen.add(var.ref())
            out.append(var)
    return out
