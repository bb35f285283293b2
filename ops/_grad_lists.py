"""Converting between `(gradient, variable)` lists and `K x N` gradient and variable lists."""

from collections.abc import Sequence

from ops._gradients import Gradient
from ops._tensorflow import tf


def split_grad_list(
    tower_grads_and_vars: Sequence[Sequence[tuple[Gradient, tf.Variable]]],
) -> tuple[list[list[Gradient]], list[list[tf.Variable]]]:
    """Splits K lists of `(gradient, variable)` pairs into `K x N` gradients and variables.

    Args:
      tower_grads_and_vars: One list of N `(gradient, variable)` pairs per tower, as returned
        by `optimizer.compute_gradients`-style code.

    Returns:
      `(grads, variables)`, both K lists of N entries; the inverse of `merge_grad_list`.

    Raises:
      ValueError: if a tower's list has a different length or holds something else than pairs.
    """
    grads, variables = [], []
    for i, pairs in enumerate(tower_grads_and_vars):
        pairs = list(pairs)
        if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in pairs):
            raise ValueError(f"Tower {i} must hold (gradient, variable) pairs; got {pairs!r}.")
        if grads and len(pairs) != len(grads[0]):
            raise ValueError(
                f"Every tower must have one pair per variable; tower 0 has {len(grads[0])} and "
                f"tower {i} has {len(pairs)}."
            )
        grads.append([g for g, _ in pairs])
        variables.append([v for _, v in pairs])
    return grads, variables


def merge_grad_list(
    grads: Sequence[Sequence[Gradient]], variables: Sequence[Sequence[tf.Variable]]
) -> list[list[tuple[Gradient, tf.Variable]]]:
    """Zips `K x N` gradients and variables into K lists of `(gradient, variable)` pairs.

    Args:
      grads: K lists of N gradients.
      variables: K lists of N variables (the same list K times for shared variables).

    Returns:
      K lists of N pairs; the inverse of `split_grad_list`.

    Raises:
      ValueError: if the two disagree on K or on N for some tower.
    """
    if len(grads) != len(variables):
        raise ValueError(
            f"`grads` and `variables` must have one list per tower; got {len(grads)} and "
            f"{len(variables)}."
        )
    merged = []
    for i, (tower_g, tower_v) in enumerate(zip(grads, variables)):
        if len(tower_g) != len(tower_v):
            raise ValueError(
                f"Tower {i} has {len(tower_g)} gradients for {len(tower_v)} variables."
            )
        merged.append(list(zip(tower_g, tower_v)))
    return merged
