"""The variable-strategy protocol: where a model's variables live and how they are updated.

`replicate`, `train_step`, the weight functions and `CheckpointManager` use a strategy through
this protocol and nothing else, so `ParameterServer`, `Replicated` and a strategy of your own
are interchangeable.
"""

import abc
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from towers.core import TowerContext, current_tower
from towers.ops.internal import Gradient, Weight, library_code
from towers.variables._keras_objects import is_keras_layer
from towers.variables._names import Copies, walk_model


@dataclasses.dataclass(frozen=True)
class ReducedGradients:
    """The reduced gradients of one copy of the variables, ready for the optimizer.

    Attributes:
      grads: One gradient per variable (None: no update for it).
      variables: The variables they update, aligned with `grads`.
      device: Where to build the update; None leaves each update on its variable's device.
      state: Which variables this copy updates and keeps optimizer state for, aligned with
        `variables` (sharded state: its own); None for all. The others are neither updated
        nor given state here, whatever the gradient hook returns for them.
      finite: None, or whether the gradients of this step that other processes hold are
        finite (sharded state across workers): part of the non-finite verdict, so that every
        worker skips (or fails) the same steps.
    """

    grads: list[Gradient]
    variables: list[tf.Variable]
    device: str | None = None
    state: tuple[bool, ...] | None = None
    finite: tf.Tensor | None = None


class VariableStrategy(abc.ABC):
    """Where the variables of towers live, and how tower gradients become updates.

    The protocol, four methods (and three with defaults: `state_copies` and `after_update`,
    for a strategy that shards optimizer state, and `sends_narrow`):

    1. `scope(tower)`: the context each tower is built in; it places the variables tower code
       creates (or refuses them), and may check the tower against the strategy's devices.
    2. `tower_variables(model, tower)`: the trainable variables tower `tower` reads and
       differentiates: one shared list, or the tower's own copy.
    3. `reduce_gradients(model, tower_grads, weights)`: the `K x N` tower gradients become a
       list of `ReducedGradients`, one per copy to update; the gradient hook and the
       optimizer are applied once to each.
    4. `variable_copies(model)`: which copies weight files see: canonical name -> every copy
       of that variable, the first first. Files hold the first copy, restores reach all. A
       strategy that keeps several copies holds its model and is passed as the model itself
       (to `train_step`, `save_weights`, `CheckpointManager`); the weight functions then ask
       it, as `strategy.variable_copies(strategy)`.

    A strategy that shards optimizer state (each copy keeps the state of its own share of
    the variables, `Replicated(shard_optimizer_state=True)`) says so with the attribute
    `shard_optimizer_state` (default False), reduces with `every_gradient=True` when a
    gradient hook must see every gradient, and gives `state_copies` and `after_update`.

    `model` is what the user passed as the variables to train: a `tf.Module`, a list of
    variables, or the strategy itself when it holds its own copies (`towers.Replicated`).

    Attributes:
      shard_optimizer_state: Whether each copy keeps optimizer state only for its share of
        the variables (and updates only those). `train_step` then reduces with
        `every_gradient=True` for a gradient hook, and refuses a hook with `accumulate`
        (each copy would accumulate only its share).
    """

    shard_optimizer_state: bool = False

    @abc.abstractmethod
    def scope(self, tower: TowerContext) -> contextlib.AbstractContextManager:
        """The scope `towers.replicate` builds `tower` in.

        Args:
          tower: The tower being built.

        Returns:
          A context manager, usually a `tf.variable_creator_scope`.
        """

    @abc.abstractmethod
    def tower_variables(self, model: Any, tower: TowerContext | None) -> list[tf.Variable]:
        """The trainable variables `tower` reads and differentiates.

        Args:
          model: The variables to train (see the class docstring).
          tower: The tower, or None outside towers (the first copy).

        Returns:
          A non-empty list of variables, aligned across towers.
        """

    @abc.abstractmethod
    def reduce_gradients(
        self,
        model: Any,
        tower_grads: list[list[Gradient]],
        weights: Sequence[Weight],
        *,
        every_gradient: bool = False,
    ) -> list[ReducedGradients]:
        """Reduces `K x N` tower gradients to the updates of each copy.

        Args:
          model: The variables to train.
          tower_grads: K lists of N gradients, tower i's aligned with
            `tower_variables(model, tower i)`.
          weights: K weights of the mean (the shard sizes).
          every_gradient: Give each copy every reduced gradient, also those of variables
            whose state it does not keep (for a gradient hook, which sees them all); each
            copy still updates only its own (`ReducedGradients.state`). Passed only to a
            strategy with `shard_optimizer_state`; others may leave the keyword out.

        Returns:
          One `ReducedGradients` per copy of the variables.
        """

    def updates_state(self, tower: TowerContext) -> bool:
        """Whether `tower` updates the non-trainable state it reads (see `towers.updates_state`).

        The default suits strategies whose towers share one copy: the first tower only.

        Args:
          tower: The tower being built.

        Returns:
          Whether to build the update in this tower.
        """
        return tower.is_chief

    def sends_narrow(self, num_towers: int) -> bool:
        """Whether `reduce_gradients` sends exact half-precision gradients in half precision.

        Under mixed precision a float32 weight's gradient is often a half-precision one
        widened; the reductions of `towers.ops` send such gradients narrow between two
        towers (`towers.ops._exact_widening`). Where this says so, compiled towers return
        them narrow; elsewhere float32, as a narrow gradient cast back outside a tower's
        program would cost a kernel per gradient and save nothing. The default: two towers,
        state not sharded (a reduce-scatter sends float32) and no `wire_dtype` attribute
        (its cast decides what crosses).

        Args:
          num_towers: The towers of one pass of the step, on one worker.

        Returns:
          Whether the exchange of those towers' gradients can send them narrow.
        """
        return (
            num_towers == 2
            and not self.shard_optimizer_state
            and getattr(self, "wire_dtype", None) is None
        )

    def state_copies(self, model: Any) -> dict[str, tuple[tf.Variable | None, ...]]:
        """Which copies of each variable keep optimizer (and accumulator) state.

        The default: every copy. A strategy sharding the state gives None for a copy that
        keeps none.

        Args:
          model: The variables to train.

        Returns:
          Canonical name -> for each copy, the variable or None.
        """
        return dict(self.variable_copies(model))

    def after_update(self, model: Any, updates: list) -> list:
        """Ops that run after the copies' updates (e.g. copying updated shares to every copy).

        The default: none. `train_step` (and `apply_replicated`) build them last.

        Args:
          model: The variables to train.
          updates: The update ops, to run after.

        Returns:
          The ops.
        """
        del model, updates
        return []

    @abc.abstractmethod
    def variable_copies(self, model: Any) -> Copies:
        """Every variable of `model` by canonical name, with all its copies, the first first.

        Args:
          model: The variables to train.

        Returns:
          Canonical name -> (copy 0, copy 1, ...); weight files hold copy 0.
        """


@library_code
def updates_state() -> bool:
    """Whether the tower being built updates non-trainable state (moving averages, counters).

    The one rule for state that is not trained: each copy is updated once per step, by one
    tower. With a copy per tower (`towers.Replicated`) every tower updates its own copy (from
    values identical on every tower, such as all-reduced statistics, to keep copies
    identical); towers sharing one copy (`towers.ParameterServer`) leave it to the first
    tower. Outside towers: True. A strategy decides through `VariableStrategy.updates_state`.

    Returns:
      Whether to build the update in this tower.

    Example:
      >>> if towers.updates_state():
      ...     self.count.assign_add(1)
    """
    tower = current_tower()
    if tower is None:
        return True
    if tower.variable_strategy is None:
        return tower.is_chief
    return bool(tower.variable_strategy.updates_state(tower))


@library_code
def trainable_list(model: Any) -> list[tf.Variable]:
    """The trainable variables of a model, or a sequence of variables as a list.

    A model is a `tf.Module` or a Keras layer or model (or a `tf.Module` holding them); its
    variables come in `towers.save_weights` order, and a frozen Keras layer's are left out.

    Raises:
      ValueError: if there are none, or something else than a variable is among them.
    """
    if isinstance(model, tf.Module) or is_keras_layer(model):
        named, frozen = walk_model(model)
        found = [v for v in named.values() if v.trainable and v.ref() not in frozen]
    elif isinstance(model, Sequence) and not isinstance(model, (str, bytes)):
        found = list(model)
    elif isinstance(model, Mapping):
        found = list(model.values())
    else:
        found = [model]
    if not found or not all(isinstance(v, tf.Variable) for v in found):
        raise ValueError(
            f"`variables` must be a non-empty list of tf.Variable or a tf.Module with trainable "
            f"variables; got {found!r}."
        )
    return found
