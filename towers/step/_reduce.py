"""A strategy's reduction for a step, and the replicated step's reduce-and-apply in one call."""

from typing import Any

from towers.ops import collective_order
from towers.ops.internal import library_code
from towers.optimizers import AppliesGradients
from towers.step._apply_reduced import GradientHook, reduced_updates
from towers.step._nonfinite import raised
from towers.variables import ReducedGradients, VariableStrategy


@library_code
def apply_replicated(
    replicas: VariableStrategy,
    tower_grads: list,
    sizes: list,
    optimizer: AppliesGradients,
    gradient_hook: GradientHook | None = None,
) -> list:
    """All-reduces tower gradients and applies the same update to every replica.

    The same as `apply_reduced(replicas.reduce_gradients(replicas, tower_grads, sizes), ...)`
    followed by `replicas.after_update(replicas, updates)` (sharded state's all-gather).

    Args:
      replicas: The `Replicated` model (or another strategy holding its copies).
      tower_grads: `K x N` gradients, tower i's for replica i's variables.
      sizes: The shard sizes (weights of the mean).
      optimizer: Applies each replica's update on its device; state per copy.
      gradient_hook: As in `train_step`, called once per replica with its (identical)
        reduced gradients; it must treat them alike to keep the replicas identical.

    Returns:
      The K optimizer updates (and the copies' synchronization, with sharded state), under
      the default non-finite guard ("raise": running them fails on a NaN or Inf step, which
      changes nothing).

    Raises:
      ValueError: if `tower_grads` does not fit the replicas (see the strategy's
        `reduce_gradients`), or for what the hook returns, as `apply_reduced`.
      TypeError: if the hook is not callable or returns something else than gradients.
    """
    reduced = reduce_for(replicas, replicas, tower_grads, sizes, gradient_hook)
    updates, verdict = reduced_updates(reduced, optimizer, gradient_hook)
    with collective_order():
        updates += replicas.after_update(replicas, updates)
    return updates + raised(verdict, updates)


def reduce_for(
    strategy: VariableStrategy,
    model: Any,
    tower_grads: list,
    sizes: list,
    gradient_hook: GradientHook | None,
) -> list[ReducedGradients]:
    """`strategy.reduce_gradients`; with sharded state and a hook, every gradient everywhere.

    A hook sees every reduced gradient (a global norm is of them all), so sharded state
    all-reduces them for it; each copy still updates only its own.
    """
    if gradient_hook is not None and strategy.shard_optimizer_state:
        return strategy.reduce_gradients(model, tower_grads, sizes, every_gradient=True)
    return strategy.reduce_gradients(model, tower_grads, sizes)
