"""The base of `towers` optimizers: state per variable and per copy, named like weight files.

A rule is one short class: the names of its slots and `update(grad, var, slots, lr, step)`
(and `update_sparse` where the rule lets sparse gradients touch only their rows). The base
keeps the state, the learning rate (a number, a tensor, a variable or a schedule), the step
count, the placement and the naming.
"""

import abc
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tensorflow as tf

from towers.ops.internal import deduplicated, densified, device_scope, library_code, update_ops
from towers.optimizers._checks import check_learning_rate
from towers.variables import CopiedState, Copies, canonical_name, state_copies

Gradient = tf.Tensor | tf.IndexedSlices
LearningRate = float | tf.Tensor | tf.Variable | Callable[[tf.Tensor], Any]


@dataclasses.dataclass
class _VariableState:
    name: str  # the variable's canonical name, as weight files name it
    copy: int  # which copy of it (replica index)
    slots: dict[str, tf.Variable]


class Optimizer(tf.Module, CopiedState):
    """Base of `towers` optimizers.

    State (the slots, and a step count per copy) is kept per variable and per copy of a
    replicated variable, on the variable's device, and named by the canonical names weight
    files use: "slots/<variable>/<slot>" and "optimizer/iterations". `build(model)` creates it
    up front and names it (`train_step` and `CheckpointManager` call it); variables first met
    in `apply_gradients` are named after `var.name`, made unique. A checkpoint saves one copy
    of each piece of state and restores it into every copy, with any number of towers.

    The learning rate is a number, a scalar tensor or variable, or a callable of the step
    count (the number of updates done, an int64 tensor), such as `towers.schedules` or Keras
    schedule objects. The step count advances once per copy and `apply_gradients` call; it
    is state only where it is used (a schedule, or a rule that reads it, as every rule does
    unless it sets `uses_step = False`), so plain SGD with a fixed rate keeps no state and
    may be made inside a `tf.function`.

    A subclass names its slots (`slot_names`, created as zeros like the variable, or with
    `initial_slot_value`) and implements `update`; it may implement `update_sparse` when its
    rule allows sparse gradients to touch only their rows (the base densifies otherwise, or
    when it returns `NotImplemented`).

    Args:
      learning_rate: The step size: a number >= 0, a scalar tensor or variable, or a
        callable of the step count.
      name: The module's name.

    Raises:
      TypeError: if `learning_rate` is of another type.
      ValueError: if `learning_rate` is a negative number.
    """

    slot_names: tuple[str, ...] = ()
    initial_slot_value: float = 0.0
    # Whether `update` reads `step`. True unless a rule says otherwise: a rule that forgets
    # the flag then only keeps a count it does not need, never sees a wrong one.
    uses_step: bool = True
    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_states"}

    def __init__(self, learning_rate: LearningRate, *, name: str):
        super().__init__(name=name)
        check_learning_rate(learning_rate)
        self.learning_rate = learning_rate
        self._states: dict[Any, _VariableState] = {}  # variable.ref() -> its state
        self.iterations: dict[int, tf.Variable] = {}  # copy -> its step count
        self.slot_variables: list[tf.Variable] = []  # every slot, for tf.Module.variables

    @abc.abstractmethod
    def update(
        self,
        grad: tf.Tensor,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """Builds one variable's update from a dense gradient.

        Args:
          grad: The gradient, of the variable's shape and dtype.
          var: The variable.
          slots: Its slots by name.
          lr: The learning rate, in the variable's dtype.
          step: The 1-based number of this update, in the variable's dtype.

        Returns:
          The update op (or the op's output).
        """

    def update_sparse(
        self,
        grad: tf.IndexedSlices,
        var: tf.Variable,
        slots: dict[str, tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor,
    ) -> Any:
        """Builds the update from sparse rows with unique indices, or declines it.

        Args:
          grad: The gradient's rows, duplicates summed.
          var: The variable.
          slots: Its slots by name.
          lr: The learning rate, in the variable's dtype.
          step: The 1-based number of this update, in the variable's dtype.

        Returns:
          The update, or `NotImplemented` when the rule needs every row (then `update` gets
          the dense gradient).
        """
        del grad, var, slots, lr, step
        return NotImplemented

    @library_code
    def build(self, variables: Any) -> None:
        """Creates the state of every variable (and copy) that lacks it, and names it.

        Args:
          variables: What to build for: a model (a `tf.Module`, a list or dict of variables),
            a strategy holding copies (`towers.Replicated`: the copies that keep state), or a
            mapping of canonical name to the variable's copies (`strategy.state_copies(model)`;
            None for a copy that keeps none).
        """
        copies = variables if _is_copies(variables) else state_copies(variables)
        for name, group in copies.items():
            for copy, var in enumerate(group):
                if var is not None:  # sharded state: this copy keeps none
                    self._state_of(var, name, copy)

    @library_code
    def state_name(self, var: tf.Variable) -> str:
        """The name the state of `var` goes by in weight files (its state is made if new).

        Args:
          var: A variable this optimizer updates.

        Returns:
          The canonical name, e.g. "dense/kernel" (state "slots/dense/kernel/m").
        """
        return self._state_of(var).name

    def variable_copies(self) -> Copies:
        """The state by name: "slots/<variable>/<slot>" and "optimizer/iterations".

        Returns:
          Name -> the state of each copy, the first copy's first.
        """
        found: dict[str, dict[int, tf.Variable]] = {}
        for state in self._states.values():
            for slot, var in state.slots.items():
                found.setdefault(f"slots/{state.name}/{slot}", {})[state.copy] = var
        if self.iterations:
            found["optimizer/iterations"] = dict(self.iterations)
        return {
            name: tuple(v for _, v in sorted(by_copy.items())) for name, by_copy in found.items()
        }

    @library_code
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Gradient | None, tf.Variable]]) -> Any:
        """Applies one update per `(gradient, variable)` pair; None gradients are skipped.

        Args:
          grads_and_vars: Pairs of gradient and variable.

        Returns:
          An op grouping the updates and the step counts (None when executing eagerly).
        """
        by_copy: dict[int, list] = {}
        for grad, var in grads_and_vars:
            if grad is not None:
                state = self._state_of(var)
                by_copy.setdefault(state.copy, []).append((grad, var, state))
        ops = []
        # A plain number becomes each variable's dtype directly: through float32, a float64
        # model's rate would be off by up to 3e-8 relative.
        number = self.learning_rate if isinstance(self.learning_rate, (int, float)) else None
        for copy, group in by_copy.items():
            counter = self.iterations.get(copy)
            with device_scope(counter.device if counter is not None else None):
                with tf.name_scope(self.name):
                    done = counter.read_value() if counter is not None else tf.constant(0, tf.int64)
                    if number is None:
                        lr = tf.cast(self.current_learning_rate(done), tf.float32)
            updates, cast = [], {}
            for grad, var, state in group:
                with tf.device(var.device), tf.name_scope(self.name):
                    key = (var.device, var.dtype)
                    if key not in cast:
                        rate = tf.constant(number, var.dtype) if number is not None else lr
                        cast[key] = (tf.cast(rate, var.dtype), tf.cast(done + 1, var.dtype))
                    updates.append(self._update_one(grad, var, state.slots, *cast[key]))
            if counter is not None:
                with tf.device(counter.device), tf.control_dependencies(update_ops(updates)):
                    ops.append(counter.assign_add(1))
            ops += updates
        return tf.group(update_ops(ops))

    @property
    def counts_steps(self) -> bool:
        """Whether this optimizer keeps a step count (its rule or its schedule uses it)."""
        return self.uses_step or _is_schedule(self.learning_rate)

    @library_code
    def current_learning_rate(self, step: tf.Tensor) -> tf.Tensor:
        """The learning rate at `step` updates done.

        Args:
          step: The number of updates done, an int64 scalar.

        Returns:
          The learning rate, a scalar tensor.
        """
        rate = self.learning_rate
        if _is_schedule(rate):
            rate = rate(step)
        return tf.convert_to_tensor(rate)

    @library_code
    def excluded(self, var: tf.Variable, patterns: Iterable[str]) -> bool:
        """Whether the variable's canonical name matches one of `patterns` (ignoring case).

        Args:
          var: A variable this optimizer updates.
          patterns: Regular expressions, e.g. ("bias", "norm").

        Returns:
          Whether any pattern is found in the name.
        """
        name = self.state_name(var)
        return any(re.search(p, name, re.IGNORECASE) for p in patterns)

    def _update_one(self, grad, var, slots, lr, step):
        if isinstance(grad, tf.IndexedSlices):
            unique = deduplicated(grad)
            update = self.update_sparse(unique, var, slots, lr, step)
            if update is not NotImplemented:
                return update
            grad = densified(unique, var)
        return self.update(grad, var, slots, lr, step)

    def _state_of(self, var: tf.Variable, name: str | None = None, copy: int = 0) -> _VariableState:
        """The variable's state, created (and named) on first sight."""
        state = self._states.get(var.ref())
        if state is not None:
            if name is not None:  # built for a model now: the model's names win
                state.name, state.copy = name, copy
            return state
        name = name if name is not None else self._unique(canonical_name(var.name))
        with tf.init_scope(), tf.device(var.device):
            slots = {
                slot: tf.Variable(
                    tf.fill(var.shape, tf.cast(self.initial_slot_value, var.dtype)),
                    trainable=False,
                    name=f"{canonical_name(var.name)}/{slot}",
                )
                for slot in self.slot_names
            }
            if copy not in self.iterations and self.counts_steps:
                self.iterations[copy] = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="iterations"
                )
        self.slot_variables.extend(slots.values())
        state = self._states[var.ref()] = _VariableState(name, copy, slots)
        return state

    def _unique(self, name: str) -> str:
        taken = {s.name for s in self._states.values()}
        candidate, n = name, 1
        while candidate in taken:
            candidate, n = f"{name}_{n}", n + 1
        return candidate


def _is_schedule(rate: Any) -> bool:
    return callable(rate) and not isinstance(rate, (tf.Tensor, tf.Variable))


def _is_copies(variables: Any) -> bool:
    return isinstance(variables, Mapping) and all(isinstance(v, tuple) for v in variables.values())
