"""Loss scaling for half-precision training, and the count of skipped steps.

`train_step(..., loss_scale=...)` multiplies each tower's loss by the scale before
differentiating, divides the reduced gradients by it, and skips the update of a step whose
gradients are not all finite (every copy alike). A `LossScale` object keeps that count, and
a `DynamicLossScale` also adapts the scale; both are `tf.Module`s a checkpoint keeps
(`CheckpointManager(..., extra={"loss_scale": scale})`).
"""

from typing import Any

import tensorflow as tf

from towers.optimizers import check_coefficient


class LossScale(tf.Module):
    """A fixed loss scale, and the number of steps skipped for non-finite gradients.

    With `scale=1.0` it only counts: `train_step(..., loss_scale=towers.LossScale())` is the
    non-finite guard that skips and counts in float32 training.

    Args:
      scale: The factor, > 0 (a power of two keeps float32 gradients exact).
      name: The module's name.

    Raises:
      TypeError: if `scale` is not a number.
      ValueError: if `scale` is not positive.
    """

    def __init__(self, scale: float = 1.0, name: str = "loss_scale"):
        super().__init__(name=name)
        check_coefficient(scale, "scale", 0.0, float("inf"), closed=False)
        if scale <= 0:
            raise ValueError(f"`scale` must be > 0; got scale={scale}.")
        with tf.init_scope(), tf.device("/cpu:0"):
            self.scale = tf.Variable(float(scale), trainable=False, name="scale")
            self.skipped_steps = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name="skipped_steps"
            )

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
      initial_scale: The scale to start from, > 0.
      growth_interval: Finite steps in a row before the scale grows, >= 1.
      growth_factor: The growth, > 1.
      backoff_factor: The back-off, in (0, 1).
      min_scale: The smallest scale, > 0.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number.
      ValueError: if an argument is out of range.
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
        super().__init__(initial_scale, name=name)
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int):
            raise TypeError(f"`growth_interval` must be an int; got {growth_interval!r}.")
        if growth_interval < 1:
            raise ValueError(f"`growth_interval` must be >= 1; got {growth_interval}.")
        check_coefficient(backoff_factor, "backoff_factor", 0.0, 1.0, closed=False)
        for value, label in ((growth_factor, "growth_factor"), (min_scale, "min_scale")):
            check_coefficient(value, label, 0.0, float("inf"), closed=False)
        if growth_factor <= 1 or backoff_factor <= 0 or min_scale <= 0:
            raise ValueError(
                "`growth_factor` must be > 1, `backoff_factor` > 0 and `min_scale` > 0; got "
                f"{growth_factor}, {backoff_factor}, {min_scale}."
            )
        self.growth_interval, self.growth_factor = growth_interval, float(growth_factor)
        self.backoff_factor, self.min_scale = float(backoff_factor), float(min_scale)
        with tf.init_scope(), tf.device("/cpu:0"):
            self.good_steps = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name="good_steps"
            )

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
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)):
        raise TypeError(
            "`loss_scale` must be None, a number or a towers.LossScale / DynamicLossScale; got "
            f"{type(loss_scale).__name__}."
        )
    if loss_scale <= 0:
        raise ValueError(f"`loss_scale` must be > 0; got {loss_scale}.")
    return float(loss_scale)


def scale_value(loss_scale: LossScale | float | None) -> tf.Tensor | float:
    """The current factor (1.0 without a loss scale)."""
    if isinstance(loss_scale, LossScale):
        return loss_scale.scale.read_value()
    return 1.0 if loss_scale is None else loss_scale
