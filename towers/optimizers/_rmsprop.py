"""RMSProp, plain or centered, with optional momentum."""

from typing import Any

import tensorflow as tf

from towers.ops.internal import check_bool, check_number
from towers.optimizers import _fused as fused
from towers.optimizers._checks import check_epsilon
from towers.optimizers._optimizer import LearningRate, Optimizer


class RMSProp(Optimizer):
    """RMSProp, plain or centered, with optional momentum.

    `ms = rho ms + (1-rho) g^2; mom = momentum mom + lr g / sqrt(ms + eps); w -= mom`;
    centered, `ms - mg^2` replaces `ms`, with `mg = rho mg + (1-rho) g`.
    TensorFlow's fused `ResourceApplyRMSProp` (`ResourceApplyCenteredRMSProp`) kernel; as in
    TensorFlow, epsilon is inside the root. Sparse gradients are made dense.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      rho: The decay of the mean square, in [0, 1).
      momentum: The momentum coefficient, in [0, 1).
      epsilon: Added to the mean square under the root, > 0.
      centered: Whether to divide by the estimated variance instead of the mean square.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    uses_step = False  # the rule never reads the step count

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        name: str = "RMSProp",
    ):
        super().__init__(learning_rate, name=name)
        self.rho = check_number(rho, "rho", minimum=0.0, below=1.0)
        self.momentum = check_number(momentum, "momentum", minimum=0.0, below=1.0)
        self.epsilon = check_epsilon(epsilon)
        self.centered = check_bool(centered, "centered")
        self.slot_names = ("ms", "mom", "mg") if centered else ("ms", "mom")

    def update(
        self,
        grad: tf.Tensor,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """See `Optimizer.update`."""
        rho, mu = tf.cast(self.rho, var.dtype), tf.cast(self.momentum, var.dtype)
        return fused.rmsprop(var, slots, lr, rho, mu, tf.cast(self.epsilon, var.dtype), grad)
