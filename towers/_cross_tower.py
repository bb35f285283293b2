"""Sums across the towers being built, inside the graph: collectives meet when the step runs.

Towers are built one after another, yet tower 0 may need a value that tower 3 computes
(synchronized BatchNorm needs every tower's moments before any tower normalizes). A
collective all-reduce solves it: each tower builds its half of the exchange now, and the
halves meet at run time. Every tower must make the same calls in the same order: the n-th
call of each tower is one exchange.
"""

import random

from towers._tower_context import TowerContext, current_tower
from towers.ops._all_reduce.collective import ordering_token, outermost_graph
from towers.ops._tensorflow import tf

# Graph collection holding, for the outermost graph being built, the group key of each
# device set and each tower's count of exchanges (state of that graph, not of the process).
_KEYS = "towers.cross_tower_keys"
# Random group keys come from here: above the small ones tf.distribute counts from 1, below
# the range of towers.ops' CollectiveAllReduce ([2**20, 2**31)).
_GROUP_KEYS = range(2**19, 2**20)
_TIMEOUT_SECONDS = 120.0


def cross_tower_sum(value: tf.Tensor, weight: tf.Tensor | float | None = None) -> tf.Tensor:
    """The sum of `value` over every tower being built; outside towers, `value` itself.

    Every tower must call it alike (same order, shapes and dtypes): the n-th call of each
    tower meets the n-th call of the others when the step runs, through a collective
    all-reduce on the towers' devices. Build the step in `tf.function` or a v1 graph: eagerly,
    tower 0's sum would wait for towers not yet built.

    Gradients: with `weight` (this tower's share of the loss, such as its shard size, as
    `train_step` weights tower losses), tower j's `value` receives `(1/w_j) * sum_k w_k g_k`,
    g_k being the gradient reaching tower k's sum: so that after `train_step` weights tower j's
    gradients by w_j, the result is the gradient of the whole batch's loss. Without `weight`
    no gradient flows through the sum.

    Args:
      value: A tensor on this tower's device.
      weight: This tower's weight in the loss (a scalar > 0), or None for no gradient.

    Returns:
      The sum, on this tower's device, bit-identical on every tower.

    Raises:
      ValueError: if called eagerly inside a tower of several towers.
    """
    value = tf.convert_to_tensor(value)
    tower = current_tower()
    if tower is None or tower.num_towers == 1:
        return value if weight is not None else tf.stop_gradient(value)
    if len(tower.devices) != tower.num_towers:
        raise ValueError(
            f"Tower {tower.index} knows no device list (TowerContext.devices); build towers "
            "with towers.replicate (or train_step), which gives every tower all the devices."
        )
    if tf.executing_eagerly():
        raise ValueError(
            "towers.cross_tower_sum (and towers.BatchNorm's statistics) must be built inside "
            "tf.function or a v1 graph: eagerly, tower 0 would wait for towers not yet built. "
            "Wrap the step in @tf.function."
        )
    keys = _keys(tower)
    if weight is None:
        return _all_reduce(tf.stop_gradient(value), tower, keys[0], keys[1])
    weight = tf.cast(weight, value.dtype)

    @tf.custom_gradient
    def summed(x):
        def grad(upstream):
            return _first_order(_all_reduce(upstream * weight, tower, keys[0], keys[2])) / weight

        return _all_reduce(x, tower, keys[0], keys[1]), grad

    return summed(value)


@tf.custom_gradient
def _first_order(summed: tf.Tensor):
    """The backward exchange, refusing to be differentiated (with a clear error)."""

    def second_order(upstream):
        del upstream
        raise ValueError(
            "Second-order gradients (e.g. a gradient penalty) through towers.cross_tower_sum "
            "or a synchronized towers.BatchNorm are not supported; use BatchNorm(sync=False) "
            "or compute the penalty without batch statistics."
        )

    return tf.identity(summed), second_order


def _keys(tower: TowerContext) -> tuple[int, int, int]:
    """(group key, forward instance key, backward instance key) of this tower's next call."""
    graph = outermost_graph(tf.compat.v1.get_default_graph())
    kept = graph.get_collection_ref(_KEYS)
    if not kept:
        kept.append({"groups": {}, "calls": {}})
    state = kept[0]
    members = tuple(tower.devices)
    if members not in state["groups"]:
        state["groups"][members] = random.SystemRandom().choice(_GROUP_KEYS)
    n = state["calls"].get((members, tower.index), 0)
    state["calls"][(members, tower.index)] = n + 1
    return state["groups"][members], 2 * n + 1, 2 * n + 2


def _all_reduce(value: tf.Tensor, tower: TowerContext, group: int, instance: int) -> tf.Tensor:
    """One tower's `CollectiveReduceV2`, ordered after the device's previous collectives."""
    in_function = tf.compat.v1.executing_eagerly_outside_functions()
    with tf.device(tower.device):
        # In tf.function the shared per-device token orders collectives; a v1 graph has no
        # automatic ordering, so each waits for the tower's previous one (of this build only:
        # another step of the same graph must not depend on this one).
        token = [ordering_token(tower.device)] if in_function else []
        if not in_function and tower.v1_collectives:  # on the input: TensorFlow 2.21 drops
            with tf.control_dependencies(tower.v1_collectives[-1:]):  # a collective's own
                value = tf.identity(value)
        summed = tf.raw_ops.CollectiveReduceV2(
            input=value,
            group_size=tower.num_towers,
            group_key=group,
            instance_key=instance,
            ordering_token=token,
            merge_op="Add",
            final_op="Id",
            timeout_seconds=_TIMEOUT_SECONDS,
        )
        if not in_function:
            tower.v1_collectives.append(summed.op)
    return summed
