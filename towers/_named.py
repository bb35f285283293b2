"""Canonical, tower-free names for the variables of a weights target."""

import re
from collections.abc import Mapping, Sequence

from ops._tensorflow import tf

Target = tf.Module | Sequence[tf.Variable] | Mapping[str, tf.Variable]

# A tower or replica name-scope component, e.g. "tower_3/" or "tower_0_1/" or "replica_2/".
_TOWER_COMPONENT = re.compile(r"(^|/)(tower|replica)_\d+(_\d+)?/")


def named_variables(target: Target) -> dict[str, tf.Variable]:
    """The variables of `target` under names that any program building it agrees on.

    * A `tf.Module`: attribute paths, e.g. "encoder/layers/0/w", the same in a K-tower and a
      single-device program that build the same module (name scopes play no part).
    * A list of variables: their names without ":0" and without tower or replica scopes.
    * A dict of name to variable: the names as given.
    * Anything with `variable_copies()` (`towers.Replicated`, `towers.SGD`): one name per
      variable, the first copy.

    Args:
      target: A `tf.Module`, a list of `tf.Variable`s or a dict of name to variable.

    Returns:
      An ordered dict of name to variable.

    Raises:
      TypeError: if `target` or an entry is of another type.
      ValueError: if two variables of a list share a name.
    """
    if hasattr(target, "variable_copies"):
        return {name: copies[0] for name, copies in target.variable_copies().items()}
    if isinstance(target, tf.Module):
        found: dict[str, tf.Variable] = {}
        _walk(target, (), found, set())
        return found
    if isinstance(target, Mapping):
        for name, var in target.items():
            if not isinstance(name, str) or not isinstance(var, tf.Variable):
                raise TypeError(
                    f"A dict target maps str names to tf.Variable; got {name!r}: {var!r}."
                )
        return dict(target)
    if isinstance(target, (str, bytes)) or not isinstance(target, Sequence):
        raise TypeError(
            "`target` must be a tf.Module, a list of tf.Variable or a dict of name to variable; "
            f"got {type(target).__name__}."
        )
    found = {}
    for var in target:
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


def variable_copies(target: Target) -> dict[str, tuple[tf.Variable, ...]]:
    """Like `named_variables`, with every copy of a replicated variable, the first first."""
    if hasattr(target, "variable_copies"):
        return target.variable_copies()
    return {name: (var,) for name, var in named_variables(target).items()}


def canonical_name(name: str) -> str:
    """A variable name without its ":0" suffix and without tower or replica scopes."""
    name = name.rsplit(":", 1)[0] if re.search(r":\d+$", name) else name
    return _TOWER_COMPONENT.sub(r"\1", name)


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
