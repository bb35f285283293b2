"""What `train_step` and `CheckpointManager` need of an optimizer.

* `Optimizer`: anything with `apply_gradients(grads_and_vars)`; all `train_step` needs.
* `StatefulOptimizer`: the base of `towers` optimizers, whose state `CheckpointManager` saves
  and restores with any number of towers: `build(variables)` creates all state up front (so a
  checkpoint written before a variable got its first gradient still holds its slots), and
  `variable_copies()` names the state per variable, one entry for all replicas' copies.
* Any other optimizer that is a `tf.Module` has its variables saved by attribute path.
"""

import abc
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from towers._variable_names import Copies
from towers.ops._tensorflow import tf


class Optimizer(Protocol):
    """Anything with `apply_gradients(grads_and_vars)`, like `towers.SGD`."""

    def apply_gradients(self, grads_and_vars: list) -> Any:
        """Applies one update per `(gradient, variable)` pair."""


class StatefulOptimizer(abc.ABC):
    """The contract of `towers` optimizers with state that checkpoints keep."""

    @abc.abstractmethod
    def apply_gradients(self, grads_and_vars: list) -> Any:
        """Applies one update per `(gradient, variable)` pair; None gradients are skipped.

        Args:
          grads_and_vars: Pairs of gradient and variable.

        Returns:
          An op grouping the updates.
        """

    @abc.abstractmethod
    def build(self, variables: list[tf.Variable]) -> None:
        """Creates the state of every variable in `variables` that lacks it.

        Args:
          variables: Every copy of every variable this optimizer will update.
        """

    @abc.abstractmethod
    def variable_copies(self) -> Copies:
        """The state by name, with one entry per copy of its variable.

        Returns:
          Name -> the state variable of each copy, the first replica's first.
        """


def check_checkpointable(optimizer: Any) -> None:
    """Refuses, when a manager is made, an optimizer whose state it could not save.

    Raises:
      TypeError: naming what is accepted.
    """
    if optimizer is None or isinstance(optimizer, (StatefulOptimizer, tf.Module, Mapping)):
        return
    if isinstance(optimizer, Sequence) and all(isinstance(v, tf.Variable) for v in optimizer):
        return
    raise TypeError(
        "CheckpointManager saves an optimizer's state as variables: give a towers optimizer "
        "(towers.SGD), a tf.Module, or a list or dict of its variables (e.g. a Keras "
        f"optimizer's `optimizer.variables`); got {type(optimizer).__name__}."
    )
