"""Replicas identical from their initializers on, in a v1 graph.

Eagerly `Replicated` copies the first replica's values into the others as it builds them.
A v1 graph has no values until a session runs the initializers, and each copy's initializer
draws its own random values: K copies of a model with random initializers would train K
different models unless the user ran `broadcast()`. Here each later replica's variable is
created with the first replica's initial value (the same tensor, so one run of
`global_variables_initializer()` gives every copy the same draw), matched by creation order,
which the same `build` function repeats.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from towers.variables._replica_checks import check_new_replica


def built_replicas(build: Callable[[], Any], devices: list[str]) -> list[Any]:
    """`build()` once per device under its `tf.device` (and "replica_<i>" after the first).

    In a v1 graph, each later replica's variables take the first replica's initial values.

    Raises:
      ValueError: if `build` returns a model (or variables) it returned before.
    """
    replicas, firsts = [], []
    graph = not tf.compat.v1.executing_eagerly_outside_functions()
    for i, device in enumerate(devices):
        scope = tf.name_scope(f"replica_{i}") if i else contextlib.nullcontext()
        initial = contextlib.nullcontext()
        if graph:
            initial = initialized_like(firsts) if i else recording(firsts)
        with tf.device(device), scope, initial:
            replica = build()
        check_new_replica(replica, replicas)
        replicas.append(replica)
    return replicas


@contextlib.contextmanager
def recording(created: list[tf.Variable]) -> Iterator[None]:
    """Appends every variable created inside to `created`, in order."""

    def record(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        var = next_creator(**kwargs)
        created.append(var)
        return var

    with tf.variable_creator_scope(record):
        yield


@contextlib.contextmanager
def initialized_like(firsts: list[tf.Variable]) -> Iterator[None]:
    """Creates the j-th variable inside with `firsts[j]`'s initial value (where it fits).

    A variable without a counterpart of its shape and dtype keeps its own initializer; the
    replicas' structure check then names it.
    """
    count = [0]

    def share(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        j, count[0] = count[0], count[0] + 1
        first = firsts[j] if j < len(firsts) else None
        value = kwargs.get("initial_value")
        if first is not None and value is not None:
            if callable(value):  # (what tf.Variable would call; its ops are left unused)
                value = kwargs["initial_value"] = value()
            value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
            if value.dtype == first.dtype and value.shape.is_compatible_with(first.shape):
                kwargs["initial_value"] = first.initial_value
        return next_creator(**kwargs)

    with tf.variable_creator_scope(share):
        yield
