"""Learning-rate schedules: callables of the optimizer's step count (updates done)."""

import abc
import math
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.core import as_caller_would, library_code, user_code_entry
from towers.ops.internal import check_int, check_number


class Schedule(abc.ABC):
    """A learning rate as a function of the number of updates done.

    Call it with the step count (an int or an int64 tensor, 0 for the first update); it
    returns a float32 scalar. Any optimizer of `towers` (and any callable of the step)
    takes one as its `learning_rate`.
    """

    @user_code_entry
    def __call__(self, step: Any) -> tf.Tensor:
        """The rate at `step` updates done.

        Args:
          step: The number of updates done.

        Returns:
          A float32 scalar tensor.
        """
        rate = as_caller_would(self.rate)  # a schedule of the user's own is user code
        return tf.cast(rate(tf.cast(step, tf.float32)), tf.float32)

    @abc.abstractmethod
    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """The rate at `step` (a float32 scalar); what a schedule implements.

        Args:
          step: The number of updates done, as float32.

        Returns:
          The rate.
        """


class Constant(Schedule):
    """The same rate at every step.

    Args:
      value: The rate, >= 0.
    """

    def __init__(self, value: float):
        self.value = _non_negative(value, "value")

    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """See `Schedule.rate`."""
        return tf.fill(tf.shape(step), tf.constant(self.value, tf.float32))


class PiecewiseConstant(Schedule):
    """`values[0]` up to step `boundaries[0]`, `values[1]` up to `boundaries[1]`, ...

    As Keras' `PiecewiseConstantDecay`: `values[i]` while `boundaries[i-1] < step <=
    boundaries[i]`, and the last value after the last boundary.

    Args:
      boundaries: Increasing step counts (ints >= 0), compared with the step as int64.
      values: One more rate than boundaries.

    Raises:
      ValueError: if the lengths disagree, boundaries do not increase, or a rate is negative.
      TypeError: if a boundary is not an int.
    """

    def __init__(self, boundaries: Sequence[int], values: Sequence[float]):
        self.boundaries, self.values = (
            [check_int(b, "each boundary", minimum=0) for b in boundaries],
            [_non_negative(v, "values") for v in values],
        )
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError(
                f"`values` must have one more entry than `boundaries`; got {len(self.values)} "
                f"values for {len(self.boundaries)} boundaries."
            )
        if any(b >= c for b, c in zip(self.boundaries, self.boundaries[1:])):
            raise ValueError(f"`boundaries` must increase; got {self.boundaries}.")

    @library_code
    def __call__(self, step: Any) -> tf.Tensor:
        """See `Schedule.__call__`; the step is compared as an int64 (exact past 2**24)."""
        step = tf.cast(step, tf.int64)
        passed = (
            tf.reduce_sum(tf.cast(step > tf.constant(self.boundaries, tf.int64), tf.int32))
            if self.boundaries
            else tf.constant(0)
        )
        return tf.gather(tf.constant(self.values, tf.float32), passed)

    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """See `Schedule.rate` (`step` as float32: exact up to 2**24)."""
        return self(tf.cast(tf.round(step), tf.int64))


class ExponentialDecay(Schedule):
    """`initial * decay_rate ** (step / decay_steps)`, the exponent floored if `staircase`.

    Args:
      initial: The rate at step 0, >= 0.
      decay_steps: Steps per factor of `decay_rate`, > 0.
      decay_rate: The factor, > 0.
      staircase: Whether to decay in whole steps of `decay_steps`.

    Raises:
      ValueError: if an argument is out of range.
    """

    def __init__(
        self, initial: float, decay_steps: int, decay_rate: float, staircase: bool = False
    ):
        self.initial = _non_negative(initial, "initial")
        self.decay_steps = _positive(decay_steps, "decay_steps")
        self.decay_rate = _positive(decay_rate, "decay_rate")
        self.staircase = bool(staircase)

    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """See `Schedule.rate`."""
        exponent = step / self.decay_steps
        if self.staircase:
            exponent = tf.floor(exponent)
        return self.initial * tf.pow(tf.constant(self.decay_rate, tf.float32), exponent)


class CosineDecay(Schedule):
    """Half a cosine from `initial` down to `alpha * initial` over `decay_steps`, then flat.

    Args:
      initial: The rate at step 0, >= 0.
      decay_steps: The length of the decay, > 0.
      alpha: The final rate as a fraction of `initial`, in [0, 1].

    Raises:
      ValueError: if an argument is out of range.
    """

    def __init__(self, initial: float, decay_steps: int, alpha: float = 0.0):
        self.initial = _non_negative(initial, "initial")
        self.decay_steps = _positive(decay_steps, "decay_steps")
        alpha = check_number(alpha, "alpha", minimum=0.0, maximum=1.0)
        self.alpha = float(alpha)

    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """See `Schedule.rate`."""
        done = tf.minimum(step, self.decay_steps) / self.decay_steps
        cosine = 0.5 * (1.0 + tf.cos(math.pi * done))
        return self.initial * ((1.0 - self.alpha) * cosine + self.alpha)


class LinearWarmup(Schedule):
    """A linear ramp up to the rate `after` starts at, then `after`.

    During the first `warmup_steps` steps the rate rises linearly to `after(0)` (or `after`
    itself, a number); from then on it is `after(step - warmup_steps)`, so the schedule after
    the warm-up runs from its own step 0. By default the first update already moves:
    `peak * (step + 1) / warmup_steps`, reaching the peak at the last warm-up step (a ramp
    from 0, as Keras', optax's and Hugging Face's, makes the first update do nothing). With
    `initial`, the ramp runs from `initial` at step 0 to the peak at `warmup_steps`.

    Args:
      warmup_steps: The length of the ramp, > 0.
      after: A number, a `Schedule` or any callable of the step count.
      initial: The rate at step 0, >= 0; None (default) for `peak / warmup_steps`.

    Raises:
      ValueError: if an argument is out of range.
      TypeError: if `after` is neither a number nor callable.
    """

    def __init__(
        self,
        warmup_steps: int,
        after: float | Callable[[Any], Any],
        initial: float | None = None,
    ):
        self.warmup_steps = _positive(warmup_steps, "warmup_steps")
        if not callable(after):
            after = Constant(_non_negative(after, "after"))
        self.after = after
        self.initial = None if initial is None else _non_negative(initial, "initial")

    def rate(self, step: tf.Tensor) -> tf.Tensor:
        """See `Schedule.rate`."""
        peak = tf.cast(self.after(tf.constant(0, tf.int64)), tf.float32)
        if self.initial is None:
            ramp = peak * (step + 1.0) / self.warmup_steps
        else:
            ramp = self.initial + (peak - self.initial) * step / self.warmup_steps
        since = tf.cast(tf.maximum(step - self.warmup_steps, 0.0), tf.int64)
        return tf.where(step < self.warmup_steps, ramp, tf.cast(self.after(since), tf.float32))


def _non_negative(value: Any, name: str) -> float:
    return check_number(value, name, minimum=0.0)


def _positive(value: Any, name: str) -> float:
    return check_number(value, name, above=0.0)
