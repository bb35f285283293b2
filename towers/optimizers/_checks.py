"""What optimizers accept, and what `towers` accepts as an optimizer."""

import inspect
import numbers
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from towers.ops.internal import check_number


class AppliesGradients(Protocol):
    """Anything with `apply_gradients(grads_and_vars)`: all that `train_step` needs."""

    def apply_gradients(self, grads_and_vars: list) -> Any:
        """Applies one update per `(gradient, variable)` pair."""


def check_learning_rate(learning_rate: Any) -> None:
    """A number >= 0, a floating scalar tensor or variable, or a callable (a schedule).

    Raises:
      TypeError: for anything else.
      ValueError: for a negative, NaN or infinite number.
    """
    if isinstance(learning_rate, (tf.Tensor, tf.Variable)):
        if learning_rate.shape.rank not in (None, 0) or not learning_rate.dtype.is_floating:
            raise TypeError(
                f"`learning_rate` must be a floating scalar; got {learning_rate.dtype.name} of "
                f"shape {learning_rate.shape}."
            )
        return
    if callable(learning_rate):
        _check_takes_step(learning_rate)
        return
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real):
        raise TypeError(
            "`learning_rate` must be a number, a scalar tensor or variable, or a schedule "
            f"(a callable of the step count); got {learning_rate!r}."
        )
    check_number(learning_rate, "learning_rate", minimum=0.0)


def check_epsilon(epsilon: Any) -> float:
    """A finite number > 0 that stays > 0 in float32.

    1e-46 is 0 there: a zero gradient's update would be 0 / 0.

    Raises:
      TypeError: for a non-number.
      ValueError: for a number <= 0, not finite, or 0 in float32.
    """
    epsilon = check_number(epsilon, "epsilon", above=0.0)
    if np.float32(epsilon) == 0:
        raise ValueError(
            f"`epsilon` must stay > 0 in float32; got {epsilon:g}, which rounds to 0 there "
            "(a variable whose gradient is exactly 0 would become NaN). Use >= 1e-38."
        )
    return epsilon


def _check_takes_step(schedule: Any) -> None:
    """Refuses a callable that cannot take the step count (e.g. a Keras 2 `lambda: 0.1`)."""
    try:
        inspect.signature(schedule).bind(0)
    except TypeError:
        raise TypeError(
            f"A callable `learning_rate` is a schedule: it is called with the optimizer's step "
            f"count; got {schedule!r}, which cannot take one argument. Write `lambda step: ...`."
        ) from None
    except ValueError:  # no signature to read (some builtins): trust it
        pass


def check_decays_representable(var: Any, **decays: float) -> None:
    """Refuses a variable whose dtype rounds a decay rate to 1 (bfloat16 rounds 0.999 so).

    Such a rule would divide by `1 - decay**step` = 0 or never update; master weights in
    float32 (the mixed-precision recipe) avoid it.

    Raises:
      ValueError: naming the variable, the decay and what it rounds to.
    """
    dtype = var.dtype.as_numpy_dtype
    for label, decay in decays.items():
        rounded = float(np.asarray(decay, dtype=dtype))
        if rounded >= 1.0:
            raise ValueError(
                f"`{label}`={decay} rounds to {rounded} in {var.dtype.name}, the dtype of "
                f"variable {var.name}: the update would be 0 or NaN. Keep the trained "
                f"variables in float32 and compute in {var.dtype.name} (see docs/precision.md's "
                "recipe)."
            )


def check_checkpointable(optimizer: Any) -> None:
    """Refuses, when a manager is made, an optimizer whose state it could not save.

    Raises:
      TypeError: naming what is accepted.
    """
    if optimizer is None or isinstance(optimizer, (tf.Module, Mapping)) or is_keras(optimizer):
        return
    if isinstance(optimizer, (list, tuple)) and all(isinstance(v, tf.Variable) for v in optimizer):
        return
    hint = ""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        hint = (
            " A tf.compat.v1.train optimizer creates its slots on its first update and has no "
            "way to build them before: use a towers optimizer, or pass `optimizer.variables()` "
            "once a step has run."
        )
    raise TypeError(
        "CheckpointManager saves an optimizer's state as variables: give a towers optimizer "
        "(towers.SGD, towers.Adam, ...), a Keras optimizer, a tf.Module, or a list or dict of "
        f"its variables; got {type(optimizer).__name__}.{hint}"
    )


def is_keras(optimizer: Any) -> bool:
    """Whether `optimizer` is a Keras 3 optimizer (recognized by what it provides)."""
    return (
        type(optimizer).__module__.startswith("keras")
        and callable(getattr(optimizer, "build", None))
        and hasattr(optimizer, "variables")
        and hasattr(optimizer, "iterations")
    )
