"""What `train_step` and `CheckpointManager` need of an optimizer, as declared protocols.

* `Optimizer`: `apply_gradients(grads_and_vars)`; the only requirement of `train_step`.
* `BuildsState`: `build(variables)` creates all its state up front, so that a checkpoint saved
  before a variable got its first gradient still holds every slot (`towers.SGD` does).
* Its state is saved like a weights target: an object with `variable_copies()` (one entry
  per variable, with a copy per replica, as `towers.SGD` gives), else a `tf.Module`'s
  variables by attribute path.
"""

from typing import Any, Protocol, runtime_checkable

from towers.ops._tensorflow import tf


class Optimizer(Protocol):
    """Anything with `apply_gradients(grads_and_vars)`, like `towers.SGD`."""

    def apply_gradients(self, grads_and_vars: list) -> Any:
        """Applies one update per `(gradient, variable)` pair."""


@runtime_checkable
class BuildsState(Protocol):
    """An optimizer that creates its state (slots) for given variables on request."""

    def build(self, variables: list[tf.Variable]) -> None:
        """Creates the state of every variable in `variables` that lacks it."""
