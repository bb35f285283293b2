"""Adam, and AdamW with decoupled weight decay."""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import check_int, check_number
from towers.optimizers import _fused as fused
from towers.optimizers._checks import check_decays_representable, check_epsilon
from towers.optimizers._optimizer import LearningRate, Optimizer


class Adam(Optimizer):
    """Adam, with moments `m`, `v` and a bias correction folded into the step size.

    `m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    w -= lr sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps)`, t the 1-based update count.
    TensorFlow's fused `ResourceApplyAdam` kernel, one op per variable. Sparse gradients are
    made dense: every row's moments decay.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      beta_1: The first moment's decay, in [0, 1).
      beta_2: The second moment's decay, in [0, 1).
      epsilon: Added to the root of the second moment, > 0.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    slot_names = ("m", "v")

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        name: str = "Adam",
    ):
        super().__init__(learning_rate, name=name)
        self.beta_1 = check_number(beta_1, "beta_1", minimum=0.0, below=1.0)
        self.beta_2 = check_number(beta_2, "beta_2", minimum=0.0, below=1.0)
        self.epsilon = check_epsilon(epsilon)

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
        epsilon = tf.cast(self.epsilon, var.dtype)
        return fused.adam(var, slots["m"], slots["v"], lr, b1, b2, epsilon, step, grad)


class AdamW(Adam):
    """Adam with decoupled weight decay: `w -= lr * weight_decay * w`, then the Adam update.

    Variables whose canonical name (the attribute path, e.g. "blocks/0/ln_1/gamma") matches
    a pattern of `exclude` get no decay, nor, with `exclude_rank_below=2`, variables of fewer
    than 2 dimensions: every bias and normalization gain, whatever it is called (GPT-style
    names such as "ln_1" match neither "bias" nor "norm"; nanoGPT decays only matrices).

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      weight_decay: The decay coefficient, >= 0 (scaled by the learning rate).
      beta_1: The first moment's decay, in [0, 1).
      beta_2: The second moment's decay, in [0, 1).
      epsilon: Added to the root of the second moment, > 0.
      exclude: Regular expressions; a variable whose name matches one gets no decay.
      exclude_rank_below: Variables of fewer dimensions than this get no decay; 0 (default)
        excludes by name only.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        weight_decay: float = 0.004,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        exclude: Sequence[str] = ("bias", "norm"),
        name: str = "AdamW",
        *,
        exclude_rank_below: int = 0,
    ):
        super().__init__(learning_rate, beta_1, beta_2, epsilon, name=name)
        check_number(weight_decay, "weight_decay", minimum=0.0)
        self.weight_decay, self.exclude = float(weight_decay), tuple(exclude)
        self.exclude_rank_below = check_int(exclude_rank_below, "exclude_rank_below", minimum=0)

    def update(
        self,
        grad: tf.Tensor,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """See `Optimizer.update`."""
        decays = var.shape.rank is None or var.shape.rank >= self.exclude_rank_below
        if self.weight_decay and decays and not self.excluded(var, self.exclude):
            decayed = var.assign_sub(var * (lr * tf.cast(self.weight_decay, var.dtype)))
            with tf.control_dependencies([getattr(decayed, "op", decayed)]):
                return super().update(grad, var, slots, lr, step)
        return super().update(grad, var, slots, lr, step)
