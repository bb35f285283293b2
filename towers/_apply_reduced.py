"""Applying a strategy's reduced gradients: the gradient hook, checked, then the optimizer."""

from collections.abc import Callable, Sequence

from towers._optimizer_checks import AppliesGradients
from towers._variable_strategy import ReducedGradients, VariableStrategy
from towers.ops._device_scope import device_scope
from towers.ops._tensorflow import tf

GradientHook = Callable[[list, list], Sequence]


def apply_reduced(
    reduced: Sequence[ReducedGradients],
    optimizer: AppliesGradients,
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
      ValueError: if the hook returns the wrong number of gradients, or one of a wrong shape
        or dtype (checked while the graph is built); rows of `tf.IndexedSlices` it returns
        are checked when the step runs, before any variable changes.
      TypeError: if the hook is not callable or returns something else than gradients.
    """
    if gradient_hook is not None and not callable(gradient_hook):
        raise TypeError(f"`gradient_hook` must be callable; got {gradient_hook!r}.")
    hooked, checks = [], []
    for copy in reduced:
        grads = copy.grads
        if gradient_hook is not None:
            with device_scope(copy.device):
                grads = gradient_hook(grads, copy.variables)
                checks += _checked(grads, copy.grads, copy.variables)
        hooked.append(grads)
    updates = []
    for copy, grads in zip(reduced, hooked):
        with device_scope(copy.device), tf.control_dependencies(checks):
            pairs = [(g, v) for g, v in zip(grads, copy.variables) if g is not None]
            updates.append(optimizer.apply_gradients(pairs))
    return updates


def apply_replicated(
    replicas: VariableStrategy,
    tower_grads: list,
    sizes: list,
    optimizer: AppliesGradients,
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
def _checked(grads: Sequence, given: Sequence, variables: list[tf.Variable]) -> list:
    """Checks the hook's gradients against the variables; returns the run-time checks.

    Shapes and dtypes are checked now, while the graph is built. Rows of `tf.IndexedSlices`
    the hook made (not those it was given) are checked when the step runs: every update
    waits for these checks, so a bad row changes no variable.
    """
    if not isinstance(grads, (list, tuple)) or len(grads) != len(variables):
        raise ValueError(
            f"`gradient_hook` must return a list of {len(variables)} gradients, one per "
            f"variable; got {grads!r}."
        )
    checks = []
    for grad, original, var in zip(grads, given, variables):
        if grad is None:
            continue
        if not isinstance(grad, (tf.Tensor, tf.IndexedSlices)):
            raise TypeError(
                f"`gradient_hook` returned a {type(grad).__name__} for variable {var.name}; "
                "return tf.Tensor, tf.IndexedSlices or None."
            )
        _check_shape(grad, var)
        if isinstance(grad, tf.IndexedSlices) and grad is not original:
            checks += _checked_rows(grad, var)
    return checks


def _check_shape(grad: tf.Tensor | tf.IndexedSlices, var: tf.Variable) -> None:
    sparse = isinstance(grad, tf.IndexedSlices)
    values = grad.values if sparse else grad
    shape, got = (var.shape[1:], values.shape[1:]) if sparse else (var.shape, values.shape)
    if values.dtype != var.dtype or not got.is_compatible_with(shape):
        raise ValueError(
            f"`gradient_hook` returned a {values.dtype.name}{values.shape} gradient for "
            f"variable {var.name} of {var.dtype.name}{var.shape}; return one of the "
            "variable's shape and dtype (cast with tf.cast), or None to skip it."
        )
    if sparse:
        indices = grad.indices
        rows_agree = indices.shape[:1].is_compatible_with(values.shape[:1])
        if indices.dtype not in (tf.int32, tf.int64) or indices.shape.rank != 1 or not rows_agree:
            raise ValueError(
                f"`gradient_hook` returned tf.IndexedSlices for variable {var.name} whose "
                f"indices are {indices.dtype.name}{indices.shape} for values of shape "
                f"{values.shape}; indices must be one int32 or int64 row index per value row."
            )


def _checked_rows(grad: tf.IndexedSlices, var: tf.Variable) -> list:
    rows = tf.cast(tf.shape(var)[0], grad.indices.dtype)
    message = f"`gradient_hook` returned row indices outside [0, rows) for variable {var.name}"
    checks = [
        tf.debugging.assert_non_negative(grad.indices, message=message),
        tf.debugging.assert_less(grad.indices, rows, message=message),
    ]
    return [c for c in checks if c is not None]  # eagerly they ran (and passed) already
