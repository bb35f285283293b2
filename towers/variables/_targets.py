"""What weight files see of a target: one name per variable, and every copy behind a name."""

from collections.abc import Mapping, Sequence

import tensorflow as tf

from towers.ops.internal import library_code
from towers.variables._names import CopiedState, Copies, names_of
from towers.variables._strategy import VariableStrategy

Target = (
    tf.Module | Sequence[tf.Variable] | Mapping[str, tf.Variable] | VariableStrategy | CopiedState
)


@library_code
def named_variables(target: Target) -> dict[str, tf.Variable]:
    """The variables of `target` under names that any program building it agrees on.

    * A `tf.Module`: attribute paths, e.g. "encoder/layers/0/w", the same in a K-tower and a
      single-device program that build the same module (name scopes play no part).
    * A list of variables: their names without ":0" and without tower or replica scopes.
    * A dict of name to variable: the names as given.
    * A `towers.VariableStrategy` holding its own copies of a model (`towers.Replicated`), or
      a `towers` optimizer (its state, one entry per variable for all replicas): one name per
      variable, the first copy.

    Args:
      target: A `tf.Module`, a list of `tf.Variable`s, a dict of name to variable, a
        `Replicated`, or a `towers` optimizer such as `SGD`.

    Returns:
      An ordered dict of name to variable.

    Raises:
      TypeError: if `target` or an entry is of another type.
      ValueError: if two variables of a list share a name.
    """
    return {name: copies[0] for name, copies in variable_copies(target).items()}


def variable_copies(target: Target) -> Copies:
    """Like `named_variables`, with every copy of each variable, the first first.

    A `VariableStrategy` answers for itself (`strategy.variable_copies(strategy)`), a `towers`
    optimizer for its state; anything else has one copy per variable.
    """
    if isinstance(target, VariableStrategy):
        return target.variable_copies(target)
    if isinstance(target, CopiedState):
        return target.variable_copies()
    return {name: (var,) for name, var in names_of(target).items()}


def state_copies(target: Target) -> dict[str, tuple[tf.Variable | None, ...]]:
    """Like `variable_copies`, with None for the copies that keep no optimizer state.

    A `VariableStrategy` answers for itself (`strategy.state_copies(strategy)`: sharded
    state keeps one copy's); anything else: every copy.
    """
    if isinstance(target, VariableStrategy):
        return target.state_copies(target)
    return dict(variable_copies(target))
