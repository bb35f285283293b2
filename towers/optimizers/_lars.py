"""LARS: momentum SGD with a layer-wise learning rate, for large batches."""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import check_bool, check_number
from towers.optimizers._optimizer import LearningRate, Optimizer


class LARS(Optimizer):
    """LARS (You et al., 2017): momentum SGD whose step is scaled per variable.

    `local = eta |w| / (|g| + wd |w| + eps)` (1 when a norm is 0); `m = mu m + lr local
    (g + wd w)`; `w -= m` (Nesterov: `w -= mu m + lr local (g + wd w)`). Variables whose
    canonical name matches a pattern of `exclude` (biases, normalization parameters) get no
    weight decay and `local = 1`. Plain ops; sparse gradients are made dense.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      momentum: The momentum coefficient, in [0, 1).
      weight_decay: The decay coefficient, >= 0.
      eta: The trust coefficient, > 0.
      epsilon: Added to the denominator of the local rate, >= 0.
      nesterov: Whether to use Nesterov momentum.
      exclude: Regular expressions; matching variables get no decay and no local rate.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    uses_step = False  # the rule never reads the step count

    slot_names = ("momentum",)

    def __init__(
        self,
        learning_rate: LearningRate = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        epsilon: float = 0.0,
        nesterov: bool = False,
        exclude: Sequence[str] = ("bias", "norm"),
        name: str = "LARS",
    ):
        super().__init__(learning_rate, name=name)
        self.momentum = check_number(momentum, "momentum", minimum=0.0, below=1.0)
        self.weight_decay = check_number(weight_decay, "weight_decay", minimum=0.0)
        self.eta = check_number(eta, "eta", above=0.0)
        self.epsilon = check_number(epsilon, "epsilon", minimum=0.0)
        self.nesterov = check_bool(nesterov, "nesterov")
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
        mu = tf.cast(self.momentum, var.dtype)
        if self.excluded(var, self.exclude):
            scaled = lr * grad
        else:
            wd = tf.cast(self.weight_decay, var.dtype)
            w_norm, g_norm = tf.norm(var), tf.norm(grad)
            denominator = g_norm + wd * w_norm + tf.cast(self.epsilon, var.dtype)
            positive = tf.logical_and(w_norm > 0, g_norm > 0)
            local = tf.where(
                positive,
                tf.cast(self.eta, var.dtype) * w_norm / tf.where(positive, denominator, 1),
                tf.ones_like(w_norm),
            )
            scaled = lr * local * (grad + wd * var)
        velocity = slots["momentum"].assign(mu * slots["momentum"] + scaled)
        return var.assign_sub(mu * velocity + scaled if self.nesterov else velocity)
