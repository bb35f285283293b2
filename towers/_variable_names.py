"""Canonical, tower-free names for variables: a 4-tower and a one-device program agree on them.

Weight files and checkpoints use these names (see `_weight_targets` for what a target is).
"""

import abc
import contextlib
import re
from collections.abc import Mapping, Sequence

from towers._tower_context import TowerContext
from towers.ops._tensorflow import tf

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
    * A list of variables: their names without ":0" and without tower or replica scopes.
    * A dict of name to variable: the names as given.

    Raises:
      TypeError: if `variables` or an entry is of another type.
      ValueError: if two variables of a list share a name.
    """
    if isinstance(variables, tf.Module):
        found: dict[str, tf.Variable] = {}
        _walk(variables, (), found, set())
        return found
    if isinstance(variables, Mapping):
        for name, var in variables.items():
            if not isinstance(name, str) or not isinstance(var, tf.Variable):
                raise TypeError(
                    f"A dict target maps str names to tf.Variable; got {name!r}: {var!r}."
                )
        return dict(variables)
    if isinstance(variables, (str, bytes)) or not isinstance(variables, Sequence):
        raise TypeError(
            "`target` must be a tf.Module, a list of tf.Variable, a dict of name to variable, "
            f"a towers.Replicated or a towers optimizer; got {type(variables).__name__}."
        )
    found = {}
    for var in variables:
        if not isinstance(var, tf.Variable):
            raise TypeError(f"`target` must hold only tf.Variable; got {var!r}.")
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


def _walk(node, path: tuple, found: dict, seen: set) -> None:
    """Depth-first over modules, dicts and sequences, attributes in sorted order."""
    if isinstance(node, tf.Variable):
        if not any(v is node for v in found.values()):
            found["/".join(path)] = node
    elif isinstance(node, tf.Module):
        if id(node) in seen:
            return
        seen.add(id(node))
        # Like tf.Module.variables: skip what the module says to, trackable bookkeeping included.
        ignored = node._TF_MODULE_IGNORED_PROPERTIES | tf.Module._TF_MODULE_IGNORED_PROPERTIES
        for key in sorted(vars(node)):
            if key not in ignored:
                _walk(vars(node)[key], (*path, key), found, seen)
    elif isinstance(node, Mapping):
        for key in sorted(node, key=str):
            _walk(node[key], (*path, str(key)), found, seen)
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            _walk(child, (*path, str(i)), found, seen)
