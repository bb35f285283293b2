"""Adagrad."""

from typing import Any

import tensorflow as tf

from towers.ops.internal import check_number
from towers.optimizers import _fused as fused
from towers.optimizers._checks import check_epsilon
from towers.optimizers._optimizer import LearningRate, Optimizer


class Adagrad(Optimizer):
    """Adagrad: `a += g^2; w -= lr g / (sqrt(a) + eps)`, `a` starting at a positive value.

    TensorFlow's fused `ResourceApplyAdagradV2` kernel. Sparse gradients update only their
    rows (`ResourceSparseApplyAdagradV2`, duplicate rows summed first): exact, since other
    rows' accumulators and weights do not change.

    Args:
      learning_rate: The step size: a number, a scalar tensor or variable, or a schedule.
      initial_accumulator_value: Where the accumulators start, > 0.
      epsilon: Added to the accumulator's root, > 0.
      name: The module's name.

    Raises:
      TypeError: if an argument is not a number, or `learning_rate` is none of a number, a
        floating scalar tensor or variable, or a callable of the step count.
      ValueError: if an argument is out of range.
    """

    uses_step = False  # the rule never reads the step count

    slot_names = ("accumulator",)

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        name: str = "Adagrad",
    ):
        super().__init__(learning_rate, name=name)
        self.initial_slot_value = check_number(
            initial_accumulator_value, "initial_accumulator_value", above=0.0
        )
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
        epsilon = tf.cast(self.epsilon, var.dtype)
        return fused.adagrad(var, slots["accumulator"], lr, epsilon, grad)

    def update_sparse(
        self,
        grad: tf.IndexedSlices,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """Rows only; see `Optimizer.update_sparse`."""
        epsilon = tf.cast(self.epsilon, var.dtype)
        return fused.sparse_adagrad(var, slots["accumulator"], lr, epsilon, grad)
