"""Applying a strategy's reduced gradients: the gradient hook, checked, then the optimizer."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.core import as_caller_would, user_code_entry
from towers.ops.internal import (
    device_scope,
    library_code,
    update_ops,
)
from towers.optimizers import AppliesGradients, Optimizer
from towers.step._accumulated import accumulated_updates
from towers.step._accumulator import GradientAccumulator
from towers.step._compiled import check_jit_compile
from towers.step._hook_checks import checked, unique_rows
from towers.step._loss_scale import LossScale, scale_value
from towers.step._nonfinite import (
    applied,
    finite_rate,
    flags_elsewhere,
    judged_inside,
    judging_updates,
    kept_state,
    raised,
    resolve,
)
from towers.step._verdict import Verdict, judge
from towers.variables import ReducedGradients

GradientHook = Callable[[list, list], Sequence]


@user_code_entry
def apply_reduced(
    reduced: Sequence[ReducedGradients],
    optimizer: AppliesGradients,
    gradient_hook: GradientHook | None = None,
    *,
    loss_scale: LossScale | float | None = None,
    nonfinite: str | None = "default",
    accumulate: GradientAccumulator | None = None,
    batch_size: Any = None,
    state_updates: Sequence[Callable[[], Any]] = (),
    jit_compile: bool = False,
) -> list:
    """Applies each copy's reduced gradients: unscaled, the hook (if any), the optimizer.

    Args:
      reduced: From a strategy's `reduce_gradients`.
      optimizer: Anything with `apply_gradients`; each copy's update is built under its
        `device` (when it has one), each variable's on that variable's device.
      gradient_hook: As in `train_step`, called once per entry of `reduced` with the unscaled
        (and accumulated) gradients.
      loss_scale: The loss scale the gradients carry (divided out here); a `LossScale`
        object is also told whether the step (with `accumulate`: this call) was finite,
        except under "raise" (a failing step is not skipped: it fails).
      nonfinite: What a NaN or Inf in a gradient (or in a towers optimizer's learning rate)
        does, as in `train_step` (the same default: "raise", or "skip" with a loss scale):
        "skip" (no state changes: weights, optimizer state, `state_updates`, accumulated
        sums; decided on the devices), "raise" (the same, then the updates' run fails with
        an error naming the variables) or None (no check). With `accumulate`, each call's
        gradients are checked as they are added: a skipped call adds neither its gradients
        nor its examples, nor does a call whose mean is not applied (docs/precision.md).
      accumulate: A `GradientAccumulator`: the gradients are added to its sums, and the
        hook and the optimizer run only every `every` calls, on the mean.
      batch_size: This call's number of examples (needed with `accumulate`).
      state_updates: `DeferredUpdate`s of state beside the weights (BatchNorm's moving
        averages, which `train_step` defers to here), built under the same verdict.
      jit_compile: Compile each device's update (a towers optimizer's, the verdict's
        choice inside) as one XLA program on that device, and each copy's check.

    Returns:
      The updates (and the loss scale's, the accumulator's and, for "raise", the check that
      fails the run: run them all).

    Raises:
      ValueError: if the hook returns the wrong number of gradients, or one of a wrong shape
        or dtype (checked while the graph is built); rows of `tf.IndexedSlices` it returns
        are checked when the step runs, before any variable changes; or if `nonfinite` is
        unknown.
      TypeError: if the hook is not callable or returns something else than gradients.
    """
    updates, verdict = reduced_updates(
        reduced,
        optimizer,
        gradient_hook,
        loss_scale=loss_scale,
        nonfinite=nonfinite,
        accumulate=accumulate,
        batch_size=batch_size,
        state_updates=state_updates,
        jit_compile=jit_compile,
    )
    return updates + raised(verdict, updates)


@library_code
def reduced_updates(
    reduced: Sequence[ReducedGradients],
    optimizer: AppliesGradients,
    gradient_hook: GradientHook | None = None,
    *,
    loss_scale: LossScale | float | None = None,
    nonfinite: str | None = "default",
    accumulate: GradientAccumulator | None = None,
    batch_size: Any = None,
    state_updates: Sequence[Callable[[], Any]] = (),
    jit_compile: bool = False,
    after: Sequence[Any] = (),
) -> tuple[list, Verdict]:
    """`apply_reduced`'s updates, and the verdict whose "raise" check is still to build.

    For a caller with writes of its own after the updates (sharded state's all-gather):
    `raised(verdict, after=...)` once they are built, so that a failing step fails after
    them, never between them. `after`: what an accumulated mean's own check waits for too
    (the staging of a staged input's next batch, `StagedInput.take`: its check can fail).
    """
    if gradient_hook is not None and not callable(gradient_hook):
        raise TypeError(f"`gradient_hook` must be callable; got {gradient_hook!r}.")
    nonfinite = resolve(nonfinite, loss_scale)
    jit_compile = check_jit_compile(jit_compile)
    _state_per_copy(optimizer, reduced)
    given = []
    for copy in reduced:
        with device_scope(copy.device):
            given.append(_unscaled(copy.grads, loss_scale))
    apply = functools.partial(
        _apply_now, reduced, optimizer=optimizer, gradient_hook=gradient_hook, jit=jit_compile
    )
    if accumulate is None:
        return apply(given, loss_scale=loss_scale, nonfinite=nonfinite, state=state_updates)
    # Each call is judged as it is added: a bad micro-batch must not poison the sums, nor a
    # call whose gradients would overflow them (judged: the sums with it).
    sums = []
    for copy, grads in zip(reduced, given):
        with device_scope(copy.device):
            sums.append(accumulate.with_call(grads, copy.variables, batch_size))
    verdict = _judged(reduced, sums, nonfinite, None, True, jit_compile, optimizer, alike=True)
    updates = accumulated_updates(
        reduced,
        sums,
        verdict,
        accumulate,
        batch_size,
        apply=apply,
        nonfinite=nonfinite,
        loss_scale=loss_scale,
        state_updates=state_updates,
        after=after,
    )
    return updates, verdict


def _apply_now(
    reduced,
    given,
    *,
    optimizer,
    gradient_hook,
    jit,
    nonfinite,
    loss_scale=None,
    state=(),
    others=True,
) -> list:
    """The hook on each copy's gradients, the verdict, then the optimizer under it.

    Returns the updates and the verdict (its "raise" check is the caller's to build).

    Called on a step's gradients (the verdict covers the other processes' shares,
    `ReducedGradients.finite`, and the loss scale hears of it), or on an accumulated mean
    (its calls were judged as they were added; other processes' shares with them).
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
                checks += checked(hooked_grads, grads, copy.variables)
                grads = hooked_grads
        hooked.append(grads)
    if judged_inside(reduced, hooked, nonfinite, others, jit, optimizer, hook is None):
        pairs = [_pairs(copy, grads) for copy, grads in zip(reduced, hooked)]
        updates, verdict = judging_updates(reduced, hooked, optimizer, nonfinite, pairs)
    else:
        rates = None
        if isinstance(optimizer, Optimizer):
            rates = functools.partial(finite_rate, optimizer)
        verdict = _judged(reduced, hooked, nonfinite, rates, others, jit, optimizer, hook is None)
        updates = []
        for i, (copy, grads) in enumerate(zip(reduced, hooked)):
            with device_scope(copy.device), tf.control_dependencies(update_ops(checks)):
                pairs = _pairs(copy, grads)
                updates.append(applied(optimizer, apply_gradients, pairs, verdict.of(i), jit))
    updates += kept_state(state, verdict)
    # After the updates: they read the scale it changes. Not under "raise": a failing step
    # changes nothing, the count of skipped steps included (none is skipped).
    if isinstance(loss_scale, LossScale) and nonfinite != "raise":
        with tf.control_dependencies(update_ops(updates)):
            updates.append(loss_scale.update(verdict.chosen))
    return updates, verdict


def _pairs(copy: ReducedGradients, grads: Sequence) -> list:
    """The (gradient, variable) pairs copy `copy` updates."""
    return [
        (g, v)
        for j, (g, v) in enumerate(zip(grads, copy.variables))
        if g is not None and _keeps(copy, j)
    ]


def _judged(reduced, grads, nonfinite, rates, others, jit: bool, optimizer, alike: bool) -> Verdict:
    """The verdict on each copy's `grads` (and the flags from elsewhere: `flags_elsewhere`).

    `alike`: the copies' gradients are the strategy's, unchanged (no hook ran on them).

    The error names variables as weight files do, where a towers optimizer knows them.
    """
    elsewhere = flags_elsewhere(reduced, others)
    variables = [c.variables for c in reduced]
    devices = [c.device for c in reduced]
    names_of = None
    if isinstance(optimizer, Optimizer):
        names_of = functools.partial(optimizer.state_name, create=False)
    # (positional: per_copy, variables, devices, mode, rates, elsewhere, compiled, names_of, alike)
    return judge(grads, variables, devices, nonfinite, rates, elsewhere, jit, names_of, alike)


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
