"""Towers compiled by XLA: a tower's function as one XLA program on the tower's device.

`jit_compile=True` (`replicate`, `tower_gradients`, `train_step`) traces the function once
per tower as a `tf.function(jit_compile=True)`, called on the tower's device.

A compiled program reads variables only on its own device. A tower reading its own copy
(`Replicated`) needs nothing more. Variables that live elsewhere (a parameter server's, a loss
scale on the CPU) are read through a mirror: a variable on the tower's device, assigned from
the variable before the tower runs, which the program reads in its place (its captured
handle swapped with `ConcreteFunction.set_external_captures`). What the program writes
(a Keras BatchNormalization's moving statistics) lands in the mirror and is copied back by
the tower that updates state (`towers.updates_state()`: the first, when towers share one
copy). State updates `train_step` defers to its verdict (`towers.BatchNorm`'s) leave the
program as outputs and are built outside on them.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.ops.resource_variable_ops import ResourceVariable  # no creator scopes

from towers.core import TowerContext, compiling
from towers.ops.internal import library_code, update_ops
from towers.variables import (
    DeferredUpdate,
    defer_state_update,
    deferred_state_updates,
    updates_state,
)

# Ops that only read the variable whose handle they take; anything else may write it.
_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape"})


def check_jit_compile(jit_compile: Any) -> bool:
    """`jit_compile` as a bool, or a `TypeError` naming it."""
    if not isinstance(jit_compile, bool):
        raise TypeError(f"`jit_compile` must be True or False; got {jit_compile!r}.")
    return jit_compile


class CompiledTower:
    """One tower's function compiled by XLA, called on the tower's device.

    Args:
      fn: The tower's function of one (nested) argument.
      tower: The tower it runs in (its device: where the program runs and mirrors live).
    """

    def __init__(self, fn: Callable[[Any], Any], tower: TowerContext):
        self.tower = tower
        self._fn = fn
        self._function = tf.function(self._body, jit_compile=True, autograph=False)
        self._handed: dict[int, list[DeferredUpdate]] = {}  # per concrete function
        self._tracing: list[DeferredUpdate] = []
        self._mirrors: dict[Any, tf.Variable] = {}  # variable.ref() -> its mirror
        self._prepared: set[int] = set()
        self._refreshed: set[Any] = set()  # variable.ref() of the mirrors refreshed

    def _body(self, arg: Any) -> tuple[Any, list]:
        with deferred_state_updates(prepared=False) as handed:  # built after the program
            result = self._fn(arg)
        self._tracing = list(handed)
        return result, [list(update.inputs) for update in handed]

    @library_code
    def __call__(self, arg: Any) -> Any:
        """Runs the compiled function on `arg`; returns its result, which carries no gradient.

        State updates the function made (`towers.BatchNorm`'s moving averages, and what it
        wrote to a mirror) are built after it, in the tower: handed to the step when it
        defers them (after every tower, under its verdict), else now.

        Args:
          arg: The tower's (nested) argument, tensors.

        Returns:
          What the function returns.
        """
        self._tracing = []
        with compiling():  # while traced: no exchange with other towers
            concrete = self._function.get_concrete_function(arg)
        handed = self._handed.setdefault(id(concrete), self._tracing)
        refreshed, written = self._prepare(concrete)
        with tf.control_dependencies(refreshed):  # (a v1 graph has no automatic order)
            result, inputs = concrete(arg)
        updates = []
        for update, values in zip(handed, inputs):
            pending = dataclasses.replace(update, inputs=tuple(values))
            if update.prepare is not None:  # outside the program: it may exchange
                prepared = pending.prepare(*pending.inputs)
                pending = dataclasses.replace(pending, inputs=tuple(prepared), prepare=None)
            deferred = defer_state_update(
                pending.update, pending.device, pending.inputs, writes=pending.writes
            )
            if not deferred:
                updates.append(pending())
        produced = tf.nest.flatten(result, expand_composites=True)
        with tf.control_dependencies([t for t in produced if isinstance(t, tf.Tensor)]):
            updates += self._write_back(written)
        result = tf.nest.map_structure(_no_gradient, result)
        return result if not updates else _after(result, updates)

    def _prepare(self, concrete: Any) -> tuple[list, list[tf.Variable]]:
        """Points the program at mirrors of the variables off this tower's device.

        Returns the mirrors' refreshes (the program must run after them) and the variables
        the program may write (their mirrors copied back after it).
        """
        remote = self._remote_variables(concrete)
        refreshed = []
        for var in remote.values():  # once per step: the variables do not change within it
            if var.ref() not in self._refreshed:
                refreshed.append(self._mirror(var).assign(var.read_value(), read_value=False))
                self._refreshed.add(var.ref())
        if remote and id(concrete) not in self._prepared:
            captures = []
            for external, _ in concrete.graph.captures:
                var = remote.get(id(external))
                captures.append(external if var is None else self._mirror(var).handle)
            concrete.set_external_captures(captures)
            self._prepared.add(id(concrete))
        inner = {id(external): internal for external, internal in concrete.graph.captures}
        written = [var for key, var in remote.items() if _written(inner.get(key))]
        return [r for r in refreshed if r is not None], written

    def _remote_variables(self, concrete: Any) -> dict[int, tf.Variable]:
        """The program's variables living off this tower's device, by their captured handle."""
        if any(callable(c) for c in getattr(concrete, "_captured_inputs", [])):
            raise ValueError(
                "A compiled tower's function captures a value computed when it is called (a "
                "deferred capture), which towers cannot point at tower-local copies: read it "
                "outside the tower and pass it in, or use jit_compile=False."
            )
        externals = {id(external) for external, _ in concrete.graph.captures}
        remote, here = {}, local_device(self.tower.device)
        for var in concrete.graph.variables:  # captured by their handles (eager, or v1's)
            if local_device(var.device) != here and id(var.handle) in externals:
                remote[id(var.handle)] = var
        if remote and not hasattr(concrete, "set_external_captures"):
            raise ValueError(  # TensorFlow 2.16 to 2.21 have it
                "jit_compile=True needs the variables a tower reads on its own device; this "
                "TensorFlow cannot point a compiled function at tower-local copies. Use "
                "towers.Replicated, or jit_compile=False."
            )
        return remote

    def _mirror(self, var: tf.Variable) -> tf.Variable:
        if var.ref() not in self._mirrors:
            with tf.init_scope(), tf.device(self.tower.device):
                self._mirrors[var.ref()] = ResourceVariable(
                    tf.zeros(var.shape, var.dtype),
                    trainable=False,
                    name=f"{var.name.split(':')[0]}/tower_{self.tower.index}_mirror",
                )
        return self._mirrors[var.ref()]

    def _write_back(self, written: list[tf.Variable]) -> list:
        """Copies what the program wrote to the variables, from the tower updating state.

        Handed to the step when it defers state updates: built after every tower has read
        the variables (so no tower waits for another's program) and under the verdict.
        """
        if not written or not updates_state():
            return []
        built = []
        for var in written:
            value = self._mirror(var).read_value()
            if not defer_state_update(_assigned_to(var), var.device, [value], writes=[var]):
                with tf.device(var.device):
                    built.append(var.assign(value, read_value=False))
        return built


def _assigned_to(var: tf.Variable) -> Any:
    def assign(value: tf.Tensor) -> Any:
        return var.assign(value, read_value=False)

    return assign


def _no_gradient(value: Any) -> Any:
    return tf.stop_gradient(value) if isinstance(value, tf.Tensor) else value


def _after(result: Any, updates: list) -> Any:
    """`result`'s tensors, after `updates` (so that a v1 graph runs them with the result)."""
    with tf.control_dependencies(update_ops(updates)):
        return tf.nest.map_structure(
            lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, result
        )


def _written(placeholder: tf.Tensor | None) -> bool:
    """Whether an op other than a read takes this captured handle inside the program."""
    if placeholder is None:
        return False
    return any(consumer.type not in _READS for consumer in placeholder.consumers())


def local_device(device: str) -> str:
    """A device without job, replica and task ("" stays "": placed by TensorFlow)."""
    if not device:
        return ""
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(job=None, replica=None, task=None).to_string()
