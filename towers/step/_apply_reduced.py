"""Applying a strategy's reduced gradients: the gradient hook, checked, then the optimizer."""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.core import as_caller_would, user_code_entry
from towers.ops.internal import (
    deduplicated,
    device_scope,
    host_scope,
    library_code,
    update_ops,
)
from towers.optimizers import AppliesGradients, Optimizer
from towers.step._accumulator import GradientAccumulator
from towers.step._loss_scale import LossScale, scale_value
from towers.step._nonfinite import (
    NONFINITE,
    applied_if,
    finite_rate,
    guarded,
    true_after,
    verdict,
)
from towers.variables import ReducedGradients

GradientHook = Callable[[list, list], Sequence]


@user_code_entry
def apply_reduced(
    reduced: Sequence[ReducedGradients],
    optimizer: AppliesGradients,
    gradient_hook: GradientHook | None = None,
    *,
    loss_scale: LossScale | float | None = None,
    nonfinite: str | None = None,
    accumulate: GradientAccumulator | None = None,
    batch_size: Any = None,
    state_updates: Sequence[Callable[[], Any]] = (),
) -> list:
    """Applies each copy's reduced gradients: unscaled, the hook (if any), the optimizer.

    Args:
      reduced: From a strategy's `reduce_gradients`.
      optimizer: Anything with `apply_gradients`; each copy's update is built under its
        `device` (when it has one), each variable's on that variable's device.
      gradient_hook: As in `train_step`, called once per entry of `reduced` with the unscaled
        (and accumulated) gradients.
      loss_scale: The loss scale the gradients carry (divided out here); a `LossScale`
        object is also told whether the step (with `accumulate`: this call) was finite.
      nonfinite: What a NaN or Inf in a gradient (or in a towers optimizer's learning rate)
        does: "raise" (the step fails before any state changes), "skip" (no state changes:
        weights, optimizer state, `state_updates`, accumulated sums) or None (no check).
        With `accumulate`, each call's gradients are checked as they are added: a skipped
        call adds neither its gradients nor its examples.
      accumulate: A `GradientAccumulator`: the gradients are added to its sums, and the
        hook and the optimizer run only every `every` calls, on the mean.
      batch_size: This call's number of examples (needed with `accumulate`).
      state_updates: Callables building updates of state beside the weights (BatchNorm's
        moving averages, which `train_step` defers to here), built under the same verdict:
        skipped with the step, or after its checks.

    Returns:
      The updates (and the loss scale's and the accumulator's).

    Raises:
      ValueError: if the hook returns the wrong number of gradients, or one of a wrong shape
        or dtype (checked while the graph is built); rows of `tf.IndexedSlices` it returns
        are checked when the step runs, before any variable changes; or if `nonfinite` is
        unknown.
      TypeError: if the hook is not callable or returns something else than gradients.
    """
    if gradient_hook is not None and not callable(gradient_hook):
        raise TypeError(f"`gradient_hook` must be callable; got {gradient_hook!r}.")
    if nonfinite not in NONFINITE:
        raise ValueError(f"`nonfinite` must be one of {NONFINITE}; got {nonfinite!r}.")
    _state_per_copy(optimizer, reduced)
    given = []
    for copy in reduced:
        with device_scope(copy.device):
            given.append(_unscaled(copy.grads, loss_scale))
    if accumulate is None:
        return _apply_now(
            reduced, given, optimizer, gradient_hook, loss_scale, nonfinite, state_updates, True
        )
    # Each call is judged as it is added: a bad micro-batch must not poison the sums.
    elsewhere = [c.finite for c in reduced if c.finite is not None]
    finite, checks = verdict(given, [c.variables for c in reduced], nonfinite, None, elsewhere)
    with tf.control_dependencies(update_ops(checks)):
        if nonfinite == "skip":
            batch_size = tf.where(finite, tf.cast(batch_size, tf.float32), 0.0)
        keep = finite if nonfinite == "skip" else None
        added = []
        for copy, grads in zip(reduced, given):
            with device_scope(copy.device):
                added.append(accumulate.add(grads, copy.variables, batch_size, keep=keep))
    updates = guarded(state_updates, finite, nonfinite, checks)
    if isinstance(loss_scale, LossScale):
        with tf.control_dependencies(update_ops(added)):
            updates.append(loss_scale.update(finite))

    def now() -> list:  # the mean is checked again: every call of it may have been skipped
        return _apply_now(reduced, added, optimizer, gradient_hook, None, nonfinite, (), False)

    ready = accumulate.ready()
    with tf.control_dependencies(update_ops(updates)):
        applied = tf.cond(ready, lambda: true_after(now()), lambda: tf.constant(False))
    return [applied, accumulate.finish(ready, batch_size, after=update_ops(applied)), *updates]


def _apply_now(
    reduced, given, optimizer, gradient_hook, loss_scale, nonfinite, state_updates, others
) -> list:
    """The hook on each copy's gradients, their checks, then the optimizer (or a skip).

    With `others`, the verdict covers the other processes' shares (`ReducedGradients.finite`);
    an accumulated mean was judged call by call already.
    """
    hook = None if gradient_hook is None else as_caller_would(gradient_hook)
    apply_gradients = optimizer.apply_gradients
    if not isinstance(optimizer, Optimizer):  # a user's rule may use Python control flow
        apply_gradients = as_caller_would(apply_gradients)
    hooked, checks = [], []
    for copy, grads in zip(reduced, given):
        with device_scope(copy.device):
            if hook is not None:
                grads = [unique_rows(g) for g in grads]  # so that norms of them are right
                hooked_grads = hook(grads, copy.variables)
                checks += _checked(hooked_grads, grads, copy.variables)
                grads = hooked_grads
        hooked.append(grads)
    rate = None
    if nonfinite is not None and isinstance(optimizer, Optimizer):
        rate = finite_rate(optimizer)
    elsewhere = [c.finite for c in reduced if c.finite is not None] if others else []
    finite, guards = verdict(hooked, [c.variables for c in reduced], nonfinite, rate, elsewhere)
    checks += guards
    updates = []
    for copy, grads in zip(reduced, hooked):
        with device_scope(copy.device), tf.control_dependencies(update_ops(checks)):
            pairs = [
                (g, v)
                for j, (g, v) in enumerate(zip(grads, copy.variables))
                if g is not None and _keeps(copy, j)
            ]
            if nonfinite == "skip":
                updates.append(applied_if(finite, lambda pairs=pairs: apply_gradients(pairs)))
            else:
                updates.append(apply_gradients(pairs))
    updates += guarded(state_updates, finite, nonfinite, checks)
    if isinstance(loss_scale, LossScale):  # after the updates: they read the scale it changes
        with tf.control_dependencies(update_ops(updates)):
            updates.append(loss_scale.update(finite))
    return updates


@library_code
def _state_per_copy(optimizer: AppliesGradients, reduced: Sequence[ReducedGradients]) -> None:
    """Gives every copy its own optimizer state, or refuses an optimizer that cannot.

    A towers optimizer builds state for copy i from `reduced[i]`, named as copy 0's (or, with
    sharded state, as the copy's that keeps it; state built already, e.g. by `train_step`
    from the model's names, stays as it is). Any other optimizer would keep one state for
    all copies and update it once per copy per step.
    """
    if len(reduced) < 2:
        return
    firsts = reduced[0].variables
    if not isinstance(optimizer, Optimizer):
        raise ValueError(
            f"With {len(reduced)} copies of the variables (towers.Replicated), the optimizer "
            "must keep state per copy and count one step per step: use a towers optimizer "
            f"(towers.SGD, towers.Adam, ...); got {type(optimizer).__name__}, which would "
            f"update its state {len(reduced)} times per step."
        )
    built = {}
    for j in range(len(firsts)):  # named after the copy that keeps it (sharded: its owner)
        keeping = [copy.variables[j] if _keeps(copy, j) else None for copy in reduced]
        first = next((var for var in keeping if var is not None), None)
        if first is not None:
            built[optimizer.state_name(first)] = tuple(keeping)
    optimizer.build(built)


def _keeps(copy: ReducedGradients, j: int) -> bool:
    """Whether `copy` updates (and keeps optimizer state for) variable j."""
    return copy.state is None or copy.state[j]


def unique_rows(grad: Any) -> Any:
    """`tf.IndexedSlices` with each row once (repeated rows summed); anything else as it is.

    What the gradient hook sees: `tf.linalg.global_norm` and `tf.clip_by_global_norm` of
    slices with repeated rows would measure the rows, not the gradient.
    """
    return deduplicated(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _unscaled(grads: Sequence, loss_scale: LossScale | float | None) -> list:
    if loss_scale is None:
        return list(grads)
    inverse = 1.0 / tf.cast(scale_value(loss_scale), tf.float32)
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            g = tf.IndexedSlices(
                g.values * tf.cast(inverse, g.values.dtype), g.indices, g.dense_shape
            )
        elif g is not None:
            g = g * tf.cast(inverse, g.dtype)
        out.append(g)
    return out


@library_code
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
    with host_scope():  # Assert has no GPU kernel
        checks = [
            tf.debugging.assert_non_negative(grad.indices, message=message),
            tf.debugging.assert_less(grad.indices, rows, message=message),
        ]
    return [c for c in checks if c is not None]  # eagerly they ran (and passed) already
