"""Canonical, tower-free names for variables: a 4-tower and a one-device program agree on them.

Weight files and checkpoints use these names (see `_weight_targets` for what a target is).
"""

import abc
import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from towers.core import TowerContext
from towers.variables._keras_objects import (
    as_tf_variable,
    is_keras_layer,
    is_keras_variable,
    keras_children,
    own_variables,
)
from towers.variables._keras_objects import frozen as keras_frozen

# Canonical name -> every copy of that variable (one per replica), the first first.
Copies = dict[str, tuple[tf.Variable, ...]]
Variables = tf.Module | Sequence[tf.Variable] | Mapping[str, tf.Variable]


class CopiedState(abc.ABC):
    """State kept for every copy of a model's variables (a `towers` optimizer's).

    Weight files and checkpoints name it by `variable_copies()`: one name per piece of state,
    with the state of every copy, the first copy's first.
    """

    @abc.abstractmethod
    def variable_copies(self) -> Copies:
        """The state by name, with one entry per copy of its variable.

        Returns:
          Name -> the state variable of each copy, the first replica's first.
        """


# A tower or replica name-scope component, e.g. "tower_3/" or "tower_0_1/" or "replica_2/".
_TOWER_COMPONENT = re.compile(r"(^|/)(tower|replica)_\d+(_\d+)?/")


def names_of(variables: Variables) -> dict[str, tf.Variable]:
    """The variables of a `tf.Module`, list or dict under names any program agrees on.

    * A `tf.Module`: attribute paths, e.g. "encoder/layers/0/w", the same in a K-tower and a
      single-device program that build the same module (name scopes play no part).
    * A Keras layer or model, alone or inside a `tf.Module`: sub-layers by attribute or by
      position in `layers`, then each layer's variables by short name ("seq/layers/0/kernel");
      never Keras' auto-numbered names ("dense_7"). See `_keras_objects`.
    * A list of variables: their names without ":0" and without tower or replica scopes.
    * A dict of name to variable: the names as given.

    Raises:
      TypeError: if `variables` or an entry is of another type.
      ValueError: if two variables of a list share a name.
    """
    if isinstance(variables, tf.Module) or is_keras_layer(variables):
        return walk_model(variables)[0]
    if isinstance(variables, Mapping):
        named = {}
        for name, var in variables.items():
            if not isinstance(name, str) or not (
                isinstance(var, tf.Variable) or is_keras_variable(var)
            ):
                raise TypeError(
                    f"A dict target maps str names to tf.Variable (or keras.Variable); got "
                    f"{name!r}: {_shown(var)}."
                )
            named[name] = as_tf_variable(var)  # a keras.Variable: the tf.Variable it wraps
        return named
    if isinstance(variables, (str, bytes)) or not isinstance(variables, Sequence):
        raise TypeError(
            "`target` must be a tf.Module, a list of tf.Variable, a dict of name to variable, "
            f"a towers.Replicated or a towers optimizer; got {type(variables).__name__}."
        )
    found = {}
    for var in variables:
        if not isinstance(var, tf.Variable):
            raise TypeError(f"`target` must hold only tf.Variable; got {_shown(var)}.")
        name = canonical_name(var.name)
        if name in found:
            raise ValueError(
                f"Two variables in `target` are both named {name!r}. Pass a dict of name to "
                "variable, or the tf.Module that holds them (named by attribute path)."
            )
        found[name] = var
    return found


def canonical_name(name: str) -> str:
    """A variable name without its ":0" suffix and without tower or replica scopes."""
    name = name.rsplit(":", 1)[0] if re.search(r":\d+$", name) else name
    return _TOWER_COMPONENT.sub(r"\1", name)


def without_tower_scope(tower: TowerContext) -> contextlib.AbstractContextManager:
    """A name scope equal to the current one with the tower's own component removed.

    Inside "train/tower_0/dense" it enters "train/dense/", so a variable created there is
    named "train/dense/w" in every program, whatever its number of towers.

    Args:
      tower: The tower being built; its `name_scope` is the scope `replicate` entered.

    Returns:
      The scope to create variables in; no change when the current scope is not the tower's.
    """
    current = tf.get_current_name_scope() + "/"
    if not tower.name_scope or not current.startswith(tower.name_scope):
        return contextlib.nullcontext()
    outer = tower.name_scope.rstrip("/").rpartition("/")[0]
    scope = (outer + "/" if outer else "") + current[len(tower.name_scope) :]
    # A trailing "/" makes a name scope absolute; "" is the root scope.
    return tf.name_scope(scope)


def walk_model(model: Any) -> tuple[dict[str, tf.Variable], set]:
    """The variables of a `tf.Module` or Keras object by path, and the refs of frozen ones.

    Frozen: what a Keras layer lists as non-trainable (its state, or all of a layer set to
    `trainable = False`), whatever the `tf.Variable`'s own flag says.
    """
    found: dict[str, tf.Variable] = {}
    frozen: set = set()
    _walk(model, (), found, (set(), frozen))
    return found, frozen


def _walk(node, path: tuple, found: dict, marks: tuple, later: list | None = None) -> None:
    """Depth-first over modules, Keras layers, dicts and sequences, attributes sorted.

    As `tf.Module.variables` does, a module's own variables (in attributes, lists, dicts)
    come before those of the modules it holds: `later` collects those modules.
    """
    seen, frozen = marks
    if isinstance(node, tf.Variable) or is_keras_variable(node):
        _add(found, path, as_tf_variable(node))
    elif later is not None and (isinstance(node, tf.Module) or is_keras_layer(node)):
        later.append((path, node))
    elif is_keras_layer(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        _walk_children(keras_children(node), path, found, marks)
        for short, var in own_variables(node):  # those no public attribute holds
            _add(found, (*path, short), var)
        frozen.update(v.ref() for v in keras_frozen(node))
    elif isinstance(node, tf.Module):
        if id(node) in seen:
            return
        seen.add(id(node))
        # Like tf.Module.variables: skip what the module says to, trackable bookkeeping included.
        ignored = node._TF_MODULE_IGNORED_PROPERTIES | tf.Module._TF_MODULE_IGNORED_PROPERTIES
        children = [(key, value) for key, value in sorted(vars(node).items()) if key not in ignored]
        _walk_children(children, path, found, marks)
    elif isinstance(node, Mapping):
        for key in sorted(node, key=str):
            _walk(node[key], (*path, str(key)), found, marks, later)
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            _walk(child, (*path, str(i)), found, marks, later)


def _walk_children(children: list, path: tuple, found: dict, marks: tuple) -> None:
    """A module's attributes: their variables first, then the modules they hold, in order."""
    later: list = []
    for key, child in children:
        _walk(child, (*path, key), found, marks, later)
    for child_path, child in later:
        _walk(child, child_path, found, marks)


def _add(found: dict, path: tuple, var: tf.Variable) -> None:
    """Names `var` by `path` unless it has a name already; a taken path gets "_1", "_2"..."""
    if any(v is var for v in found.values()):
        return
    name = base = "/".join(path)
    n = 0
    while name in found:
        n += 1
        name = f"{base}_{n}"
    found[name] = var


def _shown(value: Any) -> str:
    """A value in an error: its type and name or shape, never its contents."""
    name = getattr(value, "path", None) or getattr(value, "name", None)
    shape = getattr(value, "shape", None)
    parts = [f"name {name!r}" if isinstance(name, str) else "", f"shape {shape}" if shape else ""]
    details = ", ".join(p for p in parts if p)
    return f"a {type(value).__name__}" + (f" ({details})" if details else f" {value!r:.60}")
