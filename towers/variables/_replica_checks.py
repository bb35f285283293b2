"""Checks of replicated copies: their structure when built, their bits after steps, towers."""

import contextlib
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from towers.core import TowerContext
from towers.ops.internal import library_code
from towers.variables._names import names_of
from towers.variables._targets import Target, variable_copies
from towers.workers import broadcast_from_chief, current_workers


@library_code
def check_replicas_identical(target: Target, session: Any = None) -> None:
    """Checks that every copy of every variable equals the first, bit for bit.

    Eagerly it reads the variables; in a v1 graph, pass the `tf.compat.v1.Session` that
    holds their values (it runs one read of them all).

    Args:
      target: A `Replicated` (or another strategy holding copies), or a `towers` optimizer
        such as `towers.SGD` (its momentum per replica); a plain target trivially passes.
      session: In a v1 graph, the session to read the values in; None eagerly.

    Raises:
      ValueError: naming each variable whose copies differ, the replicas and the largest
        difference; or, in a v1 graph without `session`, saying to pass one.
    """
    copies = variable_copies(target)
    if session is None and not tf.executing_eagerly():
        raise ValueError(
            "check_replicas_identical reads the variables' values: in a v1 graph pass the "
            "session that holds them, check_replicas_identical(target, session)."
        )
    if session is not None:
        values = session.run({name: list(group) for name, group in copies.items()})
    else:
        values = {name: [copy.numpy() for copy in group] for name, group in copies.items()}
    differ = []
    for name, group in values.items():
        first = group[0]
        for i, value in enumerate(group[1:], start=1):
            if not np.array_equal(first, value):
                gap = float(np.max(np.abs(value.astype(np.float64) - first)))
                differ.append(f"{name} (replica {i}, max difference {gap:.3g})")
    if differ:
        raise ValueError(f"Replicated copies differ: {', '.join(differ)}.")


def check_new_replica(replica: tf.Module, earlier: list[tf.Module]) -> None:
    """Refuses a replica that is, or shares variables with, an earlier one.

    Raises:
      ValueError: naming the two replicas and the fix.
    """
    mine = {v.ref() for v in names_of(replica).values()}
    for i, other in enumerate(earlier):
        if other is replica or mine & {v.ref() for v in names_of(other).values()}:
            raise ValueError(
                f"`build` returned a model for replica {len(earlier)} that is (or shares "
                f"variables with) the one of replica {i}. `build` must create a new model on "
                "every call, e.g. `lambda: Model()`, not `lambda: model`."
            )


def check_same_structure(replicas: list[tf.Module]) -> None:
    """Checks that the replicas have variables, the same names, shapes and dtypes.

    Raises:
      ValueError: if the first has no variables, or naming the variables a replica differs in.
    """
    first = {n: (v.shape, v.dtype) for n, v in names_of(replicas[0]).items()}
    if not first:
        raise ValueError(
            "`build` returned a model without variables; build them in `build` (e.g. call the "
            "model once on a sample)."
        )
    for i, replica in enumerate(replicas[1:], start=1):
        other = {n: (v.shape, v.dtype) for n, v in names_of(replica).items()}
        differ = sorted(n for n in first.keys() | other.keys() if first.get(n) != other.get(n))
        if differ:
            raise ValueError(
                f"Replica {i} differs from replica 0 in variables {differ}; `build` must build "
                "the same model every time."
            )


def tower_scope(tower: TowerContext, devices: list[str]) -> contextlib.AbstractContextManager:
    """`Replicated`'s tower scope: tower i on replica i's device; no variable created.

    Raises:
      ValueError: naming the tower and the replicas' devices.
    """
    if tower.num_towers != len(devices) or tower.device != devices[tower.index]:
        raise ValueError(
            f"`devices` must be the devices of the Replicated variables, one tower per "
            f"replica; got tower {tower.index} of {tower.num_towers} on {tower.device!r}, "
            f"replicas on {devices}."
        )
    return tf.variable_creator_scope(functools.partial(_refuse, tower))


def _refuse(tower: TowerContext, next_creator: Any, **kwargs: Any) -> tf.Variable:
    """A variable creator that refuses: `Replicated`'s replicas are built up front."""
    del next_creator
    raise ValueError(
        f"Tower {tower.index} created variable {kwargs.get('name')!r}; with Replicated "
        "every variable must exist when the Replicated is built. Build the model "
        "completely in `build` (e.g. call it once on a sample)."
    )


def copy_first(groups: list[tuple], algorithm: Any, devices: list[str]) -> tf.Operation | None:
    """Every copy takes the first copy's value (worker 0's, across workers).

    Now, or the op that does it in a v1 graph (`Replicated.broadcast`).
    """
    if current_workers().num_workers > 1:
        return broadcast_from_chief(algorithm, devices, groups)
    assigned = [copy.assign(copies[0]) for copies in groups for copy in copies[1:]]
    return None if tf.compat.v1.executing_eagerly_outside_functions() else tf.group(assigned)


def replica_index(tower: TowerContext | None, replicas: int) -> int:
    """The replica `tower` reads (the first outside towers).

    Raises:
      ValueError: if the towers are not as many as the replicas.
    """
    if tower is None:
        return 0
    if tower.num_towers != replicas:
        raise ValueError(
            f"{replicas} replicas cannot serve {tower.num_towers} towers; build the towers on "
            "the devices of the Replicated."
        )
    return tower.index


def check_own_model(strategy: Any, model: Any) -> None:
    """Checks that a strategy holding its own copies was passed as the model itself.

    Raises:
      ValueError: if `model` is another object.
    """
    if model is not strategy:
        raise ValueError(
            "A Replicated holds its own copies of the model; pass it as the model, e.g. "
            "towers.train_step(loss_fn, replicas, optimizer, batch, devices), not as "
            f"variable_strategy= beside another model ({type(model).__name__})."
        )
