"""Applying a strategy's reduced gradients: the gradient hook, checked, then the optimizer."""

from collections.abc import Callable, Sequence

from towers._optimizer import Optimizer
from towers._variable_strategy import ReducedGradients, VariableStrategy
from towers.ops._device_scope import device_scope
from towers.ops._tensorflow import tf

GradientHook = Callable[[list, list], Sequence]


def apply_reduced(
    reduced: Sequence[ReducedGradients],
    optimizer: Optimizer,
    gradient_hook: GradientHook | None = None,
) -> list:
    """Applies each copy's reduced gradients: the hook (if any), then the optimizer.

    Args:
      reduced: From a strategy's `reduce_gradients`.
      optimizer: Anything with `apply_gradients`; each copy's update is built under its
        `device` (when it has one), each variable's on that variable's device.
      gradient_hook: As in `train_step`, called once per entry of `reduced`.

    Returns:
      The optimizer's updates, one per entry.

    Raises:
      ValueError: if the hook returns the wrong number of gradients.
    """
    updates = []
    for copy in reduced:
        grads = copy.grads
        with device_scope(copy.device):
            if gradient_hook is not None:
                grads = _checked(gradient_hook(grads, copy.variables), copy.variables)
            pairs = [(g, v) for g, v in zip(grads, copy.variables) if g is not None]
            updates.append(optimizer.apply_gradients(pairs))
    return updates


def apply_replicated(
    replicas: VariableStrategy,
    tower_grads: list,
    sizes: list,
    optimizer: Optimizer,
    gradient_hook: GradientHook | None = None,
) -> list:
    """All-reduces tower gradients and applies the same update to every replica.

    The same as `apply_reduced(replicas.reduce_gradients(replicas, tower_grads, sizes), ...)`.

    Args:
      replicas: The `Replicated` model (or another strategy holding its copies).
      tower_grads: `K x N` gradients, tower i's for replica i's variables.
      sizes: The shard sizes (weights of the mean).
      optimizer: Applies each replica's update on its device; state per copy.
      gradient_hook: As in `train_step`, called once per replica with its (identical)
        reduced gradients; it must treat them alike to keep the replicas identical.

    Returns:
      The K optimizer updates.
    """
    return apply_reduced(
        replicas.reduce_gradients(replicas, tower_grads, sizes), optimizer, gradient_hook
    )


@tf.autograph.experimental.do_not_convert
def _checked(grads: Sequence, variables: list[tf.Variable]) -> list:
    """The hook's gradients, checked against the variables before any update is built."""
    if not isinstance(grads, (list, tuple)) or len(grads) != len(variables):
        raise ValueError(
            f"`gradient_hook` must return a list of {len(variables)} gradients, one per "
            f"variable; got {grads!r}."
        )
    for grad, var in zip(grads, variables):
        if grad is None:
            continue
        if not isinstance(grad, (tf.Tensor, tf.IndexedSlices)):
            raise TypeError(
                f"`gradient_hook` returned a {type(grad).__name__} for variable {var.name}; "
                "return tf.Tensor, tf.IndexedSlices or None."
            )
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        shape = var.shape[1:] if isinstance(grad, tf.IndexedSlices) else var.shape
        got = values.shape[1:] if isinstance(grad, tf.IndexedSlices) else values.shape
        if values.dtype != var.dtype or not got.is_compatible_with(shape):
            raise ValueError(
                f"`gradient_hook` returned a {values.dtype.name}{values.shape} gradient for "
                f"variable {var.name} of {var.dtype.name}{var.shape}; return one of the "
                "variable's shape and dtype (cast with tf.cast), or None to skip it."
            )
    return list(grads)
