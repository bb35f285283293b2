"""Variable names without the tower's name scope, so K towers and one device agree."""

import contextlib

from ops._tensorflow import tf
from towers._context import TowerContext


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
