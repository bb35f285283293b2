"""Loss scaling for half-precision training, and the count of skipped steps.

`train_step(..., loss_scale=...)` multiplies each tower's loss by the scale before
differentiating, divides the reduced gradients by it, and skips the update of a step whose
gradients are not all finite (every copy alike). A `LossScale` object keeps that count, and
a `DynamicLossScale` also adapts the scale; both are `tf.Module`s a checkpoint keeps
(`CheckpointManager(..., extra={"loss_scale": scale})`).
"""

import numbers
from typing import Any

import numpy as np
import tensorflow as tf

from towers.ops.internal import check_int, check_number, library_code
from towers.variables import state_variable

_LARGEST_FLOAT32 = float(np.finfo(np.float32).max)  # scales are float32 variables


class LossScale(tf.Module):
    """A fixed loss scale, and the number of steps skipped for non-finite gradients.

    With `scale=1.0` it only counts: `train_step(..., loss_scale=towers.LossScale())` is the
    non-finite guard that skips and counts in float32 training.

    Args:
      scale: The factor, > 0 (a power of two keeps float32 gradients exact).
      name: The module's name.

    Attributes:
      scale: The factor, a float32 variable on the CPU.
      skipped_steps: The number of steps skipped so far, an int64 variable on the CPU.

    Raises:
      TypeError: if `scale` is not a number.
      ValueError: if `scale` is not positive.
    """

    def __init__(self, scale: float = 1.0, name: str = "loss_scale"):
        super().__init__(name=name)
        scale = check_number(scale, "scale", above=0.0, maximum=_LARGEST_FLOAT32)
        self._hidden = not tf.inside_function()  # (made in a trace: see `state_variable`)
        zero = lambda: tf.constant(0, tf.int64)  # noqa: E731
        kept = dict(hidden=self._hidden, trainable=False)
        self.scale = state_variable(scale, "/cpu:0", name="scale", **kept)
        self.skipped_steps = state_variable(zero, "/cpu:0", name="skipped_steps", **kept)

    @library_code
    def update(self, finite: tf.Tensor) -> Any:
        """Counts a skipped step when `finite` is False.

        Args:
          finite: Whether this step's gradients were all finite (a boolean scalar).

        Returns:
          The update op.
        """
        with tf.device(self.skipped_steps.device):
            return self.skipped_steps.assign_add(tf.cast(tf.logical_not(finite), tf.int64))


class DynamicLossScale(LossScale):
    """The standard dynamic loss scale: grow after a run of finite steps, back off on overflow.

    After `growth_interval` finite steps in a row the scale is multiplied by
    `growth_factor`; a step with a non-finite gradient is skipped, the scale multiplied by
    `backoff_factor` (not below `min_scale`) and the run restarts.

    Args:
      initial_scale: The scale to start from, > 0 and a float32 (at most 3.4e38).
      growth_interval: Finite steps in a row before the scale grows, >= 1.
      growth_factor: The growth, > 1.
      backoff_factor: The back-off, in (0, 1).
      min_scale: The smallest scale, > 0.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number.
      ValueError: if an argument is out of range.

    Example:
      >>> loss_scale = towers.DynamicLossScale()
      >>> loss, _ = towers.train_step(loss_fn, model, optimizer, batch, devices,
      ...                             loss_scale=loss_scale)  # float16 compute in loss_fn
      >>> int(loss_scale.skipped_steps), float(loss_scale.scale)
    """

    def __init__(
        self,
        initial_scale: float = 2.0**15,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float = 1.0,
        name: str = "dynamic_loss_scale",
    ):
        initial_scale = check_number(
            initial_scale, "initial_scale", above=0.0, maximum=_LARGEST_FLOAT32
        )
        super().__init__(initial_scale, name=name)
        self.growth_interval = check_int(growth_interval, "growth_interval", minimum=1)
        self.growth_factor = check_number(growth_factor, "growth_factor", above=1.0)
        self.backoff_factor = check_number(backoff_factor, "backoff_factor", above=0.0, below=1.0)
        self.min_scale = check_number(min_scale, "min_scale", above=0.0)
        zero = lambda: tf.constant(0, tf.int64)  # noqa: E731
        kept = dict(hidden=self._hidden, trainable=False)
        self.good_steps = state_variable(zero, "/cpu:0", name="good_steps", **kept)

    @library_code
    def update(self, finite: tf.Tensor) -> Any:
        """Adapts the scale to this step and counts it if skipped.

        Args:
          finite: Whether this step's gradients were all finite (a boolean scalar).

        Returns:
          The update op.
        """
        with tf.device(self.scale.device):
            good = self.good_steps + 1
            grown = self.scale * self.growth_factor
            # Never to inf: an infinite scale could not back off (inf * 0.5 is inf).
            grow = tf.logical_and(finite, good >= self.growth_interval)
            grow = tf.logical_and(grow, tf.math.is_finite(grown))
            backed_off = tf.maximum(self.scale * self.backoff_factor, self.min_scale)
            scale = tf.where(finite, tf.where(grow, grown, self.scale), backed_off)
            good = tf.where(tf.logical_and(finite, tf.logical_not(grow)), good, 0)
            return tf.group(
                self.scale.assign(scale), self.good_steps.assign(good), super().update(finite)
            )


def as_loss_scale(loss_scale: Any) -> LossScale | float | None:
    """`loss_scale` checked: None, a positive number (fixed, nothing counted) or a `LossScale`.

    Raises:
      TypeError: for anything else.
      ValueError: for a number that is not positive.
    """
    if loss_scale is None or isinstance(loss_scale, LossScale):
        return loss_scale
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real):
        raise TypeError(
            "`loss_scale` must be None, a number or a towers.LossScale / DynamicLossScale; got "
            f"{type(loss_scale).__name__}."
        )
    return check_number(loss_scale, "loss_scale", above=0.0, maximum=_LARGEST_FLOAT32)


def scale_value(loss_scale: LossScale | float | None) -> tf.Tensor | float:
    """The current factor (1.0 without a loss scale)."""
    if isinstance(loss_scale, LossScale):
        return loss_scale.scale.read_value()
    return 1.0 if loss_scale is None else loss_scale
