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

from towers.ops.internal import deduplicated, densified, library_code, update_ops
from towers.optimizers._checks import check_learning_rate
from towers.optimizers._device_updates import copy_updates
from towers.variables import CopiedState, Copies, canonical_name, state_copies, state_variable

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
        self._hidden = not tf.inside_function()  # (made in a trace: see `state_variable`)

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
    def state_name(self, var: tf.Variable, *, create: bool = True) -> str | None:
        """The name the state of `var` goes by in weight files (its state is made if new).

        Args:
          var: A variable this optimizer updates.
          create: Whether to make the state of a variable met for the first time; False
            returns None for it instead.

        Returns:
          The canonical name, e.g. "dense/kernel" (state "slots/dense/kernel/m").
        """
        if not create and var.ref() not in self._states:
            return None
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
    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[Gradient | None, tf.Variable]],
        *,
        finite: tf.Tensor | None = None,
        jit_compile: bool = False,
    ) -> Any:
        """Applies one update per `(gradient, variable)` pair; None gradients are skipped.

        Args:
          grads_and_vars: Pairs of gradient and variable.
          finite: None, or a boolean scalar (the step's non-finite verdict): where False,
            the update writes every variable, slot and step count back as it was, decided
            on the devices (`tf.where`, no host round trip and no `tf.cond`). (`towers.step`
            may pass a `Judged` instead: one copy's compiled program decides the verdict.)
          jit_compile: Build each device's updates (of one copy) as one XLA program on that
            device, the choice of `finite` inside it. The learning rate and the step count
            are read outside and passed in; sparse gradients are made dense inside (XLA
            has no `unique`), which a rule's rows-only `update_sparse` equals. False: on
            GPUs a towers rule's dense updates are still one XLA program per device (each
            kernel there is a launch, and the choice fuses into the update's pass); a
            subclass's own rule, eager calls, sparse rows without a verdict (or whose number
            varies), non-float variables and other devices use TensorFlow's kernels.

        Returns:
          An op grouping the updates and the step counts (None when executing eagerly).

        Raises:
          TypeError: if `jit_compile` is not a bool.
        """
        if not isinstance(jit_compile, bool):
            raise TypeError(f"`jit_compile` must be True or False; got {jit_compile!r}.")
        by_copy: dict[int, list] = {}
        for grad, var in grads_and_vars:
            if grad is not None:
                state = self._state_of(var)
                by_copy.setdefault(state.copy, []).append((grad, var, state))
        ops = []
        for copy, group in by_copy.items():
            ops += copy_updates(self, copy, group, finite, jit_compile)
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
        filled = lambda: tf.fill(var.shape, tf.cast(self.initial_slot_value, var.dtype))  # noqa: E731
        kept = dict(hidden=self._hidden, trainable=False)
        slots = {
            slot: state_variable(
                filled, var.device, name=f"{canonical_name(var.name)}/{slot}", **kept
            )
            for slot in self.slot_names
        }
        if copy not in self.iterations and self.counts_steps:
            zero = lambda: tf.constant(0, tf.int64)  # noqa: E731
            self.iterations[copy] = state_variable(zero, var.device, name="iterations", **kept)
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
