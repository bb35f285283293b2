"""LAMB: Adam with a layer-wise trust ratio, for large batches."""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import check_number
from towers.optimizers._adam import Adam
from towers.optimizers._checks import check_decays_representable
from towers.optimizers._optimizer import LearningRate


class LAMB(Adam):
    """LAMB (You et al., 2019): Adam's direction, scaled per variable by a trust ratio.

    `m`, `v` as Adam; `r = m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd w`;
    `w -= lr * ratio * r` with `ratio = |w| / |r|` (1 when either norm is 0). Variables whose
    canonical name matches a pattern of `exclude` (biases, normalization parameters) get no
    weight decay and ratio 1. Plain ops (TensorFlow has no LAMB kernel); sparse gradients
    are made dense.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      beta_1: The first moment's decay, in [0, 1).
      beta_2: The second moment's decay, in [0, 1).
      epsilon: Added to the root of the second moment, > 0.
      weight_decay: The decay coefficient, >= 0.
      exclude: Regular expressions; matching variables get no decay and no trust ratio.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        weight_decay: float = 0.0,
        exclude: Sequence[str] = ("bias", "norm"),
        name: str = "LAMB",
    ):
        super().__init__(learning_rate, beta_1, beta_2, epsilon, name=name)
        self.weight_decay = check_number(weight_decay, "weight_decay", minimum=0.0)
        self.exclude = tuple(exclude)

    def update(
        self,
        grad: tf.Tensor,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """See `Optimizer.update`."""
        check_decays_representable(var, beta_1=self.beta_1, beta_2=self.beta_2)
        b1, b2 = tf.cast(self.beta_1, var.dtype), tf.cast(self.beta_2, var.dtype)
        m = slots["m"].assign(b1 * slots["m"] + (1 - b1) * grad)
        v = slots["v"].assign(b2 * slots["v"] + (1 - b2) * tf.square(grad))
        m_hat, v_hat = m / (1 - tf.pow(b1, step)), v / (1 - tf.pow(b2, step))
        direction = m_hat / (tf.sqrt(v_hat) + tf.cast(self.epsilon, var.dtype))
        if self.excluded(var, self.exclude):
            return var.assign_sub(lr * direction)
        direction += tf.cast(self.weight_decay, var.dtype) * var
        return var.assign_sub(lr * trust_ratio(var, direction) * direction)


def trust_ratio(var: tf.Variable, update: tf.Tensor) -> tf.Tensor:
    """`|w| / |update|`, or 1 when either norm is 0."""
    w_norm, u_norm = tf.norm(var), tf.norm(update)
    positive = tf.logical_and(w_norm > 0, u_norm > 0)
    return tf.where(positive, w_norm / tf.where(positive, u_norm, 1), tf.ones_like(w_norm))
