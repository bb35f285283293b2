"""The non-finite guard: one verdict per step over every copy's gradients and the rate.

A step whose gradients (or learning rate) hold a NaN or Inf either fails before any state
changes ("raise") or changes none ("skip"): weights, optimizer slots and step counts, state
updated beside them (BatchNorm's moving averages, deferred to the verdict) and accumulated
sums alike.
"""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import device_scope, host_scope, library_code, update_ops
from towers.optimizers import Optimizer

NONFINITE = ("raise", "skip", None)


@library_code
def all_finite(grads: Sequence) -> tf.Tensor:
    """Whether every value of every gradient is finite (a boolean scalar)."""
    checks = [
        tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
        for g in grads
        if g is not None
    ]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


@library_code
def finite_rate(optimizer: Optimizer) -> tf.Tensor:
    """Whether a towers optimizer's next rate is finite, as its update computes it (float32).

    A number was checked when it was given; a variable or a schedule is checked here.
    """
    if isinstance(optimizer.learning_rate, (int, float)):
        return tf.constant(True)
    counter = next(iter(optimizer.iterations.values()), None)
    with device_scope(counter.device if counter is not None else None):
        done = counter.read_value() if counter is not None else tf.constant(0, tf.int64)
        rate = tf.cast(optimizer.current_learning_rate(done), tf.float32)
        return tf.reduce_all(tf.math.is_finite(rate))


def verdict(
    per_copy: Sequence[Sequence],
    variables: Sequence[list],
    nonfinite: str | None,
    rate=None,
    elsewhere: Sequence[tf.Tensor] = (),
) -> tuple[tf.Tensor, list]:
    """(whether everything is finite, the run-time assertions for "raise").

    Args:
      per_copy: Each copy's gradients.
      variables: Each copy's variables (named in the error).
      nonfinite: "raise", "skip" or None (no check: always True).
      rate: Optional: whether the learning rate is finite (a boolean scalar).
      elsewhere: Whether gradients other processes hold are finite (boolean scalars).
    """
    if nonfinite is None:
        return tf.constant(True), []
    finite, checks = [], []
    for grads, copy_variables in zip(per_copy, variables):
        finite.append(all_finite(grads))
        if nonfinite == "raise":
            checks.append(_assert(finite[-1], "A gradient holds NaN or Inf", copy_variables))
    if rate is not None:
        finite.append(rate)
        if nonfinite == "raise":
            checks.append(_assert(rate, "The learning rate is NaN or Inf", variables[0]))
    for other in elsewhere:
        finite.append(other)
        if nonfinite == "raise":
            checks.append(_assert(other, "Another worker's gradient holds NaN or Inf", []))
    # One verdict for all copies: a hook that treats copies differently must not split them.
    return tf.reduce_all(tf.stack(finite)), checks


def _assert(finite: tf.Tensor, what: str, variables: list) -> Any:
    with host_scope():  # Assert has no GPU kernel
        return tf.debugging.Assert(
            finite,
            [
                f"{what}; no variable was changed (nor optimizer state, moving averages or "
                f"accumulated sums). Variables: {[v.name for v in variables]}. Pass "
                "nonfinite='skip' (or a loss scale) to skip such steps instead."
            ],
        )


def applied_if(finite: tf.Tensor, apply: Callable[[], Any]) -> tf.Tensor:
    """`apply()` under `tf.cond`: a True output when applied, False when skipped."""

    def run() -> tf.Tensor:
        return true_after([apply()])

    return tf.cond(finite, run, lambda: tf.constant(False))


def true_after(updates: list) -> tf.Tensor:
    with tf.control_dependencies(update_ops(updates)):
        return tf.constant(True)


def guarded(
    updates: Sequence[Callable[[], Any]], finite: tf.Tensor, nonfinite: str | None, checks: list
) -> list:
    """Builds the deferred state `updates` as the verdict says: skipped, after the checks."""
    if not updates:
        return []

    def run() -> list:
        with tf.control_dependencies(update_ops(checks)):
            return [update() for update in updates]

    if nonfinite == "skip":
        return [applied_if(finite, run)]
    return run()
