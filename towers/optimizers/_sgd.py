"""Stochastic gradient descent, with optional (Nesterov) momentum."""

from typing import Any

import tensorflow as tf

from towers.ops.internal import check_bool, check_number
from towers.optimizers import _fused as fused
from towers.optimizers._optimizer import LearningRate, Optimizer


class SGD(Optimizer):
    """Stochastic gradient descent, with optional (Nesterov) momentum.

    `w -= lr g`; with momentum `m = mu m + g; w -= lr m` (Nesterov: `w -= lr (g + mu m)`).

    TensorFlow's fused kernels (`ResourceApplyGradientDescent`, `ResourceApplyMomentum`), one
    op per variable, on its device (plain ops where the device has no such kernel: bfloat16
    on a GPU). Sparse gradients update only their rows without momentum
    (exact: other rows get no change); with momentum every row's momentum decays, so they
    are made dense.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      momentum: The momentum coefficient in [0, 1); 0 keeps no slot.
      nesterov: Whether to use Nesterov momentum.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number (or `learning_rate` a tensor, variable or
        schedule).
      ValueError: if `learning_rate` is negative or `momentum` is outside [0, 1).

    Example:
      >>> optimizer = towers.SGD(towers.schedules.CosineDecay(0.1, 1000), momentum=0.9)
    """

    uses_step = False  # the rule never reads the step count

    def __init__(
        self,
        learning_rate: LearningRate = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        name: str = "SGD",
    ):
        super().__init__(learning_rate, name=name)
        self.momentum = check_number(momentum, "momentum", minimum=0.0, below=1.0)
        self.nesterov = check_bool(nesterov, "nesterov")
        self.slot_names = ("momentum",) if momentum else ()

    def update(
        self,
        grad: tf.Tensor,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """See `Optimizer.update`."""
        if not self.momentum:
            return fused.gradient_descent(var, lr, grad)
        mu = tf.cast(self.momentum, var.dtype)
        return fused.momentum(var, slots["momentum"], lr, grad, mu, self.nesterov)

    def update_sparse(
        self,
        grad: tf.IndexedSlices,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """Rows only without momentum; see `Optimizer.update_sparse`."""
        if self.momentum:
            return NotImplemented  # every row's momentum decays: dense
        return var.scatter_sub(tf.IndexedSlices(grad.values * lr, grad.indices))
