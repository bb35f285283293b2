"""Writes kept or undone on the device: a boolean chooses between a variable's new and old value.

A step whose verdict arrives on a device (a GPU's `is_finite` of its gradients) must not make
the host wait for it: a `tf.cond` on such a flag copies it to the host and stalls every update
behind it, in TensorFlow's executor and in XLA alike. Here every write happens, and then each
written variable takes `tf.where(keep, new, old)`: a skipped step is a step that wrote the old
values. (A select, not a product: NaN times 0 is NaN.) Inside an XLA program the read, the
update and the select fuse into one pass over each variable.
"""

from collections.abc import Callable, Sequence
from typing import Any

from towers.ops._tensorflow import tf
from towers.ops._updates import update_ops


def selected(
    keep: tf.Tensor | None, variables: Sequence[tf.Variable], build: Callable[[], Any]
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

    Returns:
      The ops to run (or wait for): the writes and the choices after them.
    """
    if keep is None:
        return update_ops(build())
    variables = _unique(variables)
    old = []
    for var in variables:
        with tf.device(var.device):
            old.append(_read(var))
    with tf.control_dependencies(old):  # (a v1 graph has no automatic order)
        writes = update_ops(build())
    chosen = []
    with tf.control_dependencies(writes):
        for var, before in zip(variables, old):
            with tf.device(var.device):
                value = tf.where(keep, _read(var), before)
                chosen.append(var.assign(value, read_value=False))
    return writes + update_ops(chosen)


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
