"""Sums across the towers being built, inside the graph: collectives meet when the step runs.

Towers are built one after another, yet tower 0 may need a value that tower 3 computes
(synchronized BatchNorm needs every tower's moments before any tower normalizes). A
collective all-reduce solves it: each tower builds its half of the exchange now, and the
halves meet at run time. Every tower must make the same calls in the same order: the n-th
call of each tower is one exchange. Across workers (`towers.init_workers`) the exchange
spans every worker's towers.
"""

import tensorflow as tf

from towers.core._devices import canonical_device
from towers.core._tower_context import TowerContext, current_tower
from towers.ops import CollectiveAllReduce, internal
from towers.ops.internal import library_code
from towers.workers import WorkersAllReduce, current_workers


@library_code
def cross_tower_sum(value: tf.Tensor, weight: tf.Tensor | float | None = None) -> tf.Tensor:
    """The sum of `value` over every tower being built; outside towers, `value` itself.

    Every tower must call it alike (same order, shapes and dtypes): the n-th call of each
    tower meets the n-th call of the others when the step runs, through a collective
    all-reduce on the towers' devices (every worker's, after `towers.init_workers`). Build the
    step in `tf.function` or a v1 graph: eagerly, tower 0's sum would wait for towers not yet
    built.

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
      ValueError: if called eagerly or in a compiled tower (`jit_compile=True`) of several
        towers, or towers share a device.
    """
    value = tf.convert_to_tensor(value)
    tower = current_tower()
    if tower is None or tower.num_towers * current_workers().num_workers == 1:
        return value if weight is not None else tf.stop_gradient(value)
    if len(tower.devices) != tower.num_towers:
        raise ValueError(
            f"Tower {tower.index} knows no device list (TowerContext.devices); build towers "
            "with towers.replicate (or train_step), which gives every tower all the devices."
        )
    if len(set(map(canonical_device, tower.devices))) != len(tower.devices):
        raise ValueError(
            f"towers.cross_tower_sum (and towers.BatchNorm's statistics) needs distinct "
            f"devices, one tower each; got {list(tower.devices)}: a collective over a repeated "
            "device would wait for ever. Give each tower its own (logical) device."
        )
    if tower.compiled:
        raise ValueError(
            f"Tower {tower.index} is compiled by XLA (jit_compile=True), and a compiled tower "
            "cannot meet the others mid-way: towers.cross_tower_sum (and towers.BatchNorm("
            "sync=True)) exchanges values between towers while they run, which XLA cannot "
            "(it has no collectives between TensorFlow's devices). Use BatchNorm(sync=False) "
            "or jit_compile=False."
        )
    if tf.executing_eagerly():
        raise ValueError(
            "towers.cross_tower_sum (and towers.BatchNorm's statistics) must be built inside "
            "tf.function or a v1 graph: eagerly, tower 0 would wait for towers not yet built. "
            "Wrap the step in @tf.function."
        )
    size, group, forward, backward = _keys(tower, value)
    if weight is None:
        return _all_reduce(tf.stop_gradient(value), tower, size, group, forward)
    weight = internal.weight_in(weight, value.dtype)

    @tf.custom_gradient
    def summed(x):
        def grad(upstream):
            exchanged = _all_reduce(upstream * weight, tower, size, group, backward)
            return _first_order(exchanged) / weight

        return _all_reduce(x, tower, size, group, forward), grad

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


def _keys(tower: TowerContext, value: tf.Tensor) -> tuple[int, int, int, int]:
    """(group size, group key, forward and backward instance keys) of this tower's next call.

    Within one worker the group key is drawn per graph and device set, and instance keys
    count the calls. Across workers (`towers.init_workers`), the group spans every worker's
    towers and its keys must agree without talking: the group key follows from its size
    and the local devices, and each instance key from the call's number in this trace,
    shape and dtype.
    """
    members = tuple(tower.devices)
    n = internal.trace_count(f"cross_tower:{members}:{tower.index}") - 1  # this tower's calls
    workers = current_workers().num_workers
    if workers > 1:
        size = tower.num_towers * workers
        signature = f"cross_tower:{n}:{{}}:{value.shape}:{value.dtype.name}"
        forward, backward = (internal.derived_instance_key(signature.format(w)) for w in "fb")
        group = internal.derived_group_key(internal.CROSS_TOWER_WORKERS, members, size)
        return size, group, forward, backward
    groups = internal.graph_state("cross_tower_groups")  # drawn once per graph and device set
    if members not in groups:
        groups[members] = internal.random_group_key(internal.CROSS_TOWER)
    return tower.num_towers, groups[members], 2 * n + 1, 2 * n + 2


def _timeout(tower: TowerContext) -> float:
    """The exchange's timeout in seconds (0: none): that of the strategy's all-reduce.

    `CollectiveAllReduce`'s rule when it has none of that kind: no timeout inside
    `tf.function` (in-process, or across workers, whose heartbeats report a dead one), a
    bound in v1 graphs (`WorkersAllReduce(timeout_seconds=)` sets it across workers).
    """
    algorithm = getattr(tower.variable_strategy, "algorithm", None)
    if not isinstance(algorithm, CollectiveAllReduce):
        several = current_workers().num_workers > 1
        algorithm = WorkersAllReduce() if several else CollectiveAllReduce()
    return algorithm.timeout()


def _all_reduce(
    value: tf.Tensor, tower: TowerContext, size: int, group: int, instance: int
) -> tf.Tensor:
    """This tower's half of one exchange, on its device, in its device's collective order."""
    return internal.reduce_on(tower.device, value, size, group, instance, _timeout(tower))
